"""nsys GPU metrics sampling (`--gpu-metrics-device[s]`): SM, DRAM and PCIe per GPU.

Layout of the export (nsys 2021.2 onwards):
  TARGET_INFO_GPU_METRICS(typeId, sourceId, typeName, metricId, metricName)
  GPU_METRICS(timestamp, typeId, metricId, value)
The GPU is the low byte of typeId: nsys' own GPU id, not the CUDA ordinal CUPTI's deviceId
holds (the process's view after CUDA_VISIBLE_DEVICES). TARGET_INFO_CUDA_DEVICE(gpuId, cudaId,
pid) links the two per process (device_map). Metric names differ between GPU generations and nsys
releases ("SMs Active [Throughput %]", "DRAM Read Bandwidth [Throughput %]", "PCIe RX
Throughput [Throughput %]" ...), so they are matched by pattern; the unit comes from the
bracket. A metric this GPU does not sample is simply absent from the summary.
"""
import re
from dataclasses import dataclass

from .stats import percentile

# (key, name pattern); the first match wins, units are appended from the bracket.
METRICS = (
    ("gpu_active", re.compile(r"^(GPU|GR) Active", re.I)),  # "GR Active" up to nsys 2023, "GPU Active" since
    ("tensor_active", re.compile(r"^Tensor (Active|Pipe)", re.I)),
    ("sm_active", re.compile(r"^SMs? Active", re.I)),
    ("sm_issue", re.compile(r"^SMs? Issue", re.I)),
    ("warps_in_flight", re.compile(r"^(Compute Warps in Flight|Achieved Occupancy)", re.I)),
    ("dram_read", re.compile(r"^DRAM Read", re.I)),
    ("dram_write", re.compile(r"^DRAM Write", re.I)),
    ("dram_bw", re.compile(r"^DRAM (Bandwidth|Throughput)", re.I)),
    ("pcie_rx", re.compile(r"^PCIe (RX|Read) (Throughput|Bandwidth)", re.I)),
    ("pcie_tx", re.compile(r"^PCIe (TX|Write) (Throughput|Bandwidth)", re.I)),
)


@dataclass(frozen=True)
class MetricSample:
    device: int
    timestamp: int  # ns
    key: str  # e.g. "sm_active_pct", "pcie_rx_mbps"
    value: float


def metric_key(name: str) -> str | None:
    """'SMs Active [Throughput %]' -> 'sm_active_pct'; None for metrics we do not report."""
    for key, pattern in METRICS:
        if pattern.search(name):
            unit = (re.search(r"\[([^\]]*)\]", name) or ["", ""])[1].lower()
            if "%" in unit:
                return f"{key}_pct"
            if "mb/s" in unit or "mib/s" in unit:
                return f"{key}_mbps"
            if "bytes/s" in unit or "b/s" in unit:
                return f"{key}_bps"
            return None
    return None


def load_metric_samples(db, tables) -> tuple[MetricSample, ...]:
    if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= tables:
        return ()
    keys = {}
    for type_id, metric_id, name in db.execute(
            "SELECT DISTINCT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS"):
        key = metric_key(name or "")
        if key:
            keys[(type_id, metric_id)] = key
    samples = []
    for timestamp, type_id, metric_id, value in db.execute(
            "SELECT timestamp, typeId, metricId, value FROM GPU_METRICS ORDER BY timestamp"):
        key = keys.get((type_id, metric_id))
        if key and value is not None and timestamp is not None and timestamp >= 0:
            if key.endswith("_bps"):
                key, value = key[:-4] + "_mbps", value / 1e6
            samples.append(MetricSample(type_id & 0xFF, timestamp, key, float(value)))
    return tuple(samples)


def device_map(pid: int, cuda_devices, table: dict | None) -> dict:
    """CUDA ordinal -> nsys GPU id for one process; None where the table lacks the pair.
    Without the table (older exports) the ids are assumed equal; the summary says so."""
    if table is None:
        return {d: d for d in cuda_devices}
    return {d: table.get((pid, d)) for d in cuda_devices}


def summarize_metrics(samples, devices, spans) -> dict | None:
    """{GPU id: {key: {"mean", "p95"}}} over the samples inside the training spans (epochs);
    devices: the nsys GPU ids of the rank's CUDA devices (None: unknown, skipped).

    DRAM read and write percentages sampled at the same time are added into dram_bw_pct,
    for GPUs that report them separately."""
    if samples is None:
        return None
    spans = sorted(spans)
    per_device = {}
    for s in samples:
        if s.device in devices and any(a <= s.timestamp < b for a, b in spans):
            per_device.setdefault(s.device, {}).setdefault(s.key, []).append(s)
    result = {}
    for device, series in sorted(per_device.items()):
        if "dram_bw_pct" not in series and ("dram_read_pct" in series or "dram_write_pct" in series):
            summed = {}
            for key in ("dram_read_pct", "dram_write_pct"):
                for s in series.get(key, ()):
                    summed[s.timestamp] = summed.get(s.timestamp, 0.0) + s.value
            series["dram_bw_pct"] = [MetricSample(device, t, "dram_bw_pct", v) for t, v in summed.items()]
        result[str(device)] = {key: _mean_p95([s.value for s in values]) for key, values in sorted(series.items())}
    return result


def _mean_p95(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"mean": sum(ordered) / len(ordered), "p95": percentile(ordered, 95), "samples": len(ordered)}
