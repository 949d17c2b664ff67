"""nsys GPU metrics sampling (`--gpu-metrics-device[s]`): which metrics an export holds, and where.

Two layouts (docs/PROFILING.md, "GPU metrics"), decided by the nsys that exported the report:
  2023 on:  TARGET_INFO_GPU_METRICS(typeId, sourceId, typeName, metricId, metricName)
            GPU_METRICS(timestamp, typeId, metricId, value): one row per metric and instant.
  2022.x:   GENERIC_EVENT_SOURCES(sourceId, data) with `"Name": "GpuMetrics"`,
            GENERIC_EVENT_TYPES(typeId, sourceId, data) naming the fields (`"Fields": [{"Name": ...}]`),
            GENERIC_EVENTS(rawTimestamp, timestamp NULL, typeId, data): one row per instant, its
            metrics a JSON object of strings; rawTimestamp is on the session clock (`"TimeSource":
            "SessionNs"`), the clock of the NVTX and CUPTI rows.
In both the GPU is the low byte of typeId: nsys' own GPU id, not the CUDA ordinal CUPTI's deviceId
holds (the process's view after CUDA_VISIBLE_DEVICES). TARGET_INFO_CUDA_DEVICE(gpuId, cudaId, pid)
links the two per process (device_map). Metric names differ between GPU generations and nsys
releases ("SMs Active [Throughput %]", "SM Active", "PCIe RX Throughput", "DRAM Read Bandwidth
[Throughput %]" ...), so they are matched by pattern; the unit comes from the bracket, and a name
without one is a percentage (nsys' documentation defines every metric read here as one). A metric
this GPU does not sample is simply absent from the summary.

The samples themselves are never held: gpu_metrics/read.py streams them as columns and
gpu_metrics/place.py sums them where they fall.
"""
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# (key, name pattern); the first match wins, units are appended from the bracket.
METRICS = (
    ("gpu_active", re.compile(r"^(GPU|GR) Active", re.I)),  # "GR Active" up to nsys 2023, "GPU Active" since
    ("tensor_active", re.compile(r"^Tensor (Active|Pipe)", re.I)),
    ("sm_active", re.compile(r"^SMs? Active", re.I)),
    ("sm_issue", re.compile(r"^SMs? Issue", re.I)),
    ("warps_in_flight", re.compile(r"^(Compute Warps in Flight|Achieved Occupancy)", re.I)),
    ("dram_read", re.compile(r"^DRAM Read", re.I)),
    ("dram_write", re.compile(r"^DRAM Write", re.I)),
    ("dram_bw", re.compile(r"^(DRAM|VRAM) (Bandwidth|Throughput)", re.I)),
    ("pcie_rx", re.compile(r"^PCIe (RX|Read) (Throughput|Bandwidth)", re.I)),
    ("pcie_tx", re.compile(r"^PCIe (TX|Write) (Throughput|Bandwidth)", re.I)),
)
# Every key a summary can hold, in one order (the accumulators index them so).
KEYS = tuple(f"{key}_{unit}" for key, _ in METRICS for unit in ("pct", "mbps"))
JOINT = ("dram_read", "dram_write", "pcie_tx", "pcie_rx")  # needed side by side at one instant (dram_bw, PCIe overlap)
GPU_METRICS_SOURCE = "GpuMetrics"  # GENERIC_EVENT_SOURCES' name of the 2022.x sampler


def metric_key(name: str) -> str | None:
    """'SMs Active [Throughput %]' -> 'sm_active_pct'; 'SM Active' -> 'sm_active_pct';
    'PCIe RX Throughput [bytes/s]' -> 'pcie_rx_bps'; None for metrics we do not report."""
    for key, pattern in METRICS:
        if pattern.search(name):
            bracket = re.search(r"\[([^\]]*)\]", name)
            if bracket is None:
                return f"{key}_pct"
            unit = bracket[1].lower()
            if "%" in unit:
                return f"{key}_pct"
            if "mb/s" in unit or "mib/s" in unit:
                return f"{key}_mbps"
            if "bytes/s" in unit or "b/s" in unit:
                return f"{key}_bps"
            return None
    return None


@dataclass(frozen=True)
class Series:
    """One metric of one sampled GPU: how the export names it and the key it is reported under.
    scale turns the stored value into the key's unit (1e-6 for bytes/s into MB/s)."""
    type_id: int
    metric: int | str  # GPU_METRICS.metricId, or the JSON field's name in GENERIC_EVENTS.data
    name: str
    key: str
    scale: float = 1.0

    @property
    def gpu(self) -> int:
        return self.type_id & 0xFF


@dataclass(frozen=True)
class MetricsSource:
    """Where an export keeps its GPU metrics; the samples stay in the file (read per use)."""
    path: Path
    layout: str  # "GPU_METRICS" (nsys 2023 on) or "GENERIC_EVENTS" (2022.x)
    series: tuple[Series, ...]
    ignored: tuple[str, ...]  # the metrics sampled but not reported (NVLink, clocks ...), by name
    listed: tuple[tuple[int, int], ...] = ()  # GPU_METRICS: every (typeId, metricId) TARGET_INFO_GPU_METRICS names
    unknown: int = 0  # GENERIC_EVENTS rows of a typeId no GENERIC_EVENT_TYPES row names (counted once, in SQL)
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({s.gpu for s in self.series}))

    def keys(self) -> tuple[str, ...]:
        found = {s.key for s in self.series}
        return tuple(k for k in KEYS if k in found)


def _series(type_id: int, metric, name: str) -> Series | None:
    key = metric_key(name or "")
    if key is None:
        return None
    if key.endswith("_bps"):
        return Series(type_id, metric, name, key[:-4] + "_mbps", 1e-6)
    return Series(type_id, metric, name, key)


def find_source(path: Path, db, tables: set[str]) -> MetricsSource | None:
    """The export's GPU metrics, either layout; None where it sampled none."""
    if {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= tables and db.execute("SELECT 1 FROM GPU_METRICS LIMIT 1").fetchone():
        series, ignored, listed = [], set(), set()
        for type_id, metric_id, name in db.execute(
                "SELECT DISTINCT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS"):
            if not isinstance(type_id, int) or not isinstance(metric_id, int) or not 0 <= metric_id < 1 << 16:
                continue
            listed.add((type_id, metric_id))
            found = _series(type_id, metric_id, name)
            (series.append(found) if found else ignored.add(name or ""))
        return MetricsSource(path, "GPU_METRICS", tuple(series), tuple(sorted(ignored)), tuple(sorted(listed)))
    if {"GENERIC_EVENTS", "GENERIC_EVENT_TYPES", "GENERIC_EVENT_SOURCES"} <= tables:
        sources = _sampler_sources(db)
        series, ignored = [], set()
        for type_id, source_id, data in db.execute("SELECT typeId, sourceId, data FROM GENERIC_EVENT_TYPES"):
            if source_id not in sources:
                continue
            for entry in _json(data).get("Fields") or ():
                name = entry.get("Name") if isinstance(entry, dict) else None
                if isinstance(name, str):
                    found = _series(type_id, name, name) if '"' not in name else None
                    (series.append(found) if found else ignored.add(name))
        if series and db.execute(f"SELECT 1 FROM GENERIC_EVENTS WHERE typeId IN ({_ids(series)}) LIMIT 1").fetchone():
            orphans = db.execute("SELECT COUNT(*) FROM GENERIC_EVENTS WHERE typeId NOT IN "
                                 "(SELECT typeId FROM GENERIC_EVENT_TYPES)").fetchone()[0]
            return MetricsSource(path, "GENERIC_EVENTS", tuple(series), tuple(sorted(ignored)), unknown=orphans)
    return None


def unread(db, tables: set[str]) -> str | None:
    """Why an export that holds GPU-metric rows gave none (find_source found no source), in one line; None
    where it holds none (a run without --gpu-metrics-device) or its rows are another sampler's."""
    if "GPU_METRICS" in tables and db.execute("SELECT 1 FROM GPU_METRICS LIMIT 1").fetchone():
        return ("its GPU_METRICS table holds samples but no TARGET_INFO_GPU_METRICS table names their metrics; "
                "export the report again with the nsys that recorded it")
    if "GENERIC_EVENTS" not in tables:
        return None
    missing = [t for t in ("GENERIC_EVENT_SOURCES", "GENERIC_EVENT_TYPES") if t not in tables]
    if missing and not db.execute("SELECT 1 FROM GENERIC_EVENTS LIMIT 1").fetchone():
        return None
    if missing:
        return (f"its GENERIC_EVENTS table holds rows but the export has no {' or '.join(missing)}, so none can be "
                "told to be the GPU-metrics sampler's (nsys 2022.x); export the report again")
    sources = sorted(_sampler_sources(db))
    if not sources:
        return None  # another sampler's events (ETW, ftrace, ...): not GPU metrics
    fields = sorted({str(entry.get("Name")) for (data,) in db.execute(
        f"SELECT data FROM GENERIC_EVENT_TYPES WHERE sourceId IN ({', '.join(map(str, sources))})")
        for entry in _json(data).get("Fields") or () if isinstance(entry, dict)})
    if not fields:
        return "the GpuMetrics sampler's GENERIC_EVENT_TYPES rows name no field: its samples cannot be read"
    if not any(metric_key(f) for f in fields):
        return (f"none of the {len(fields)} metrics the GpuMetrics sampler recorded is one the report reads "
                f"({', '.join(fields[:4])}{', ...' if len(fields) > 4 else ''}; docs/PROFILING.md lists the names)")
    return "the GpuMetrics sampler is named but GENERIC_EVENTS holds no sample of it (a capture that ended first?)"


def _sampler_sources(db) -> set[int]:
    """The sourceIds of GENERIC_EVENT_SOURCES that name the 2022.x GPU-metrics sampler."""
    return {sid for sid, data in db.execute("SELECT sourceId, data FROM GENERIC_EVENT_SOURCES")
            if _json(data).get("Name") == GPU_METRICS_SOURCE}


def _ids(series) -> str:
    return ", ".join(str(t) for t in sorted({s.type_id for s in series}))


def _json(text) -> dict:
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def device_map(pid: int, cuda_devices, table: dict | None) -> dict:
    """CUDA ordinal -> nsys GPU id for one process; None where the table lacks the pair.
    Without the table (older exports) the ids are assumed equal; the summary says so."""
    if table is None:
        return {d: d for d in cuda_devices}
    return {d: table.get((pid, d)) for d in cuda_devices}
