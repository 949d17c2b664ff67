"""The GPU-metric sections of the report's page (render.py) and the lab page's columns (lab/page.py).

Per GPU: SM Active, DRAM read and write (or bandwidth) and PCIe RX and TX, mean / p95 inside the
epochs; per phase the means of the same; the PCIe overlap (docs/PROFILING.md, "GPU metrics"); and
one line per kind of value the report could not place.
"""
from collections.abc import Mapping
from typing import Any

from .place import REGIONS

NA = "n/a"
# (column, keys in order of preference): the first key a GPU holds fills the column
COLUMNS = (("SM Active %", ("sm_active_pct",)), ("SM Issue %", ("sm_issue_pct",)),
           ("DRAM read", ("dram_read_pct", "dram_read_mbps")), ("DRAM write", ("dram_write_pct", "dram_write_mbps")),
           ("DRAM bandwidth", ("dram_bw_pct", "dram_bw_mbps")), ("PCIe RX", ("pcie_rx_pct", "pcie_rx_mbps")),
           ("PCIe TX", ("pcie_tx_pct", "pcie_tx_mbps")))
PHASE_COLUMNS = ("SM Active %", "DRAM read", "PCIe RX", "PCIe TX")


def columns_of(values: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """{column: (key, unit)} of the columns this GPU's metrics fill."""
    out: dict[str, tuple[str, str]] = {}
    for column, keys in COLUMNS:
        key = next((k for k in keys if k in values), None)
        if key:
            out[column] = (key, "%" if key.endswith("_pct") else "MB/s")
    return out


def cell(stat: dict | None, unit: str, p95: bool = True) -> str:
    if stat is None:
        return NA
    mean = f"{stat['mean']:.1f}" + (f" / {stat['p95']:.1f}" if p95 else "")
    return mean + ("" if unit == "%" else " MB/s")


def sections(summary: dict, who, section) -> list[str]:
    ranks, mapping = summary["ranks"], summary.get("gpu_metrics_mapping")
    per_gpu = [(r, gpu, values) for r in ranks for gpu, values in (r.get("gpu_metrics") or {}).items()]
    clean = mapping == "TARGET_INFO_CUDA_DEVICE"
    unplaced = (summary.get("gpu_metrics_unplaced") or {}).get("lines") or []
    if unread := summary.get("gpu_metrics_unread"):
        return [f"**GPU metrics not read:** {unread}.", ""]
    if not per_gpu and (clean or mapping is None) and not unplaced:
        return []
    used = [c for c, _ in COLUMNS if any(c in columns_of(v) for _, _, v in per_gpu)]
    note = "GPU is nsys' GPU id, the process's CUDA device in brackets, matched through TARGET_INFO_CUDA_DEVICE."
    if not clean:
        note = f"**Warning: GPU ids {mapping}.**"
    rows = []
    for r, gpu, values in per_gpu:
        have = columns_of(values)
        rows.append([who(r), f"{gpu} ({_cuda_of(r, gpu)})",
                     *(cell(values.get(have[c][0]), have[c][1]) if c in have else NA for c in used),
                     overlap_cell(r, gpu)])
    lines = section("GPU metrics (mean / p95 inside training epochs)", note,
                    ["rank", "GPU (CUDA device)", *used, "RX busy while TX busy"], rows)
    lines += _phases(ranks, who, section)
    lines += [f"Unplaced GPU-metric values: {line}." for line in unplaced] + ([""] if unplaced else [])
    return lines


def overlap_cell(rank: dict, gpu: str) -> str:
    """The share of PCIe-TX-busy instants when RX is busy too, or why there is none."""
    found = (rank.get("pcie_overlap") or {}).get(gpu)
    if not found:
        return NA
    if found["share"] is None:
        return f"TX never busy ({found['busy_at']})"
    return f"{found['share'] * 100:.0f} % of {found['tx_busy_samples']} TX-busy samples"


def _phases(ranks: list[dict], who, section) -> list[str]:
    rows = []
    for r in ranks:
        for gpu, regions in (r.get("gpu_metrics_phases") or {}).items():
            for region in REGIONS[1:]:
                values = regions.get(region)
                if values:
                    have = columns_of(values)
                    rows.append([who(r), gpu, region, str(next(iter(values.values()))["samples"]),
                                 *(cell(values.get(have[c][0]), have[c][1], p95=False) if c in have else NA
                                   for c in PHASE_COLUMNS)])
    if not rows:
        return []
    return section("GPU metrics per phase (means)", "A value counts in the phase range that holds it and started "
                   "last (`h2d` inside `data` is `h2d`), `other` is inside the epochs in no phase (between steps), "
                   "`comm` is inside the rank's NCCL kernels (it overlaps the phases).",
                   ["rank", "GPU", "phase", "samples", *PHASE_COLUMNS], rows)


def _cuda_of(rank: dict, gpu: str) -> str:
    cudas = [c for c, g in (rank.get("gpu_metrics_gpus") or {}).items() if str(g) == gpu]
    return "cuda " + ",".join(cudas) if cudas else NA


def lab_columns(gpu_metrics: list[Mapping[str, float | None] | None]) -> list[str]:
    """The lab page's metric columns that some GPU of its reports fills (each GPU's {key: mean}), in COLUMNS' order."""
    return [c for c, _ in COLUMNS if c != "SM Issue %" and any(c in columns_of(m or {}) for m in gpu_metrics)]


def lab_cell(metrics: Mapping[str, float | None] | None, column: str) -> str:
    """A GPU's mean in one of lab_columns."""
    have = columns_of(metrics or {})
    if column not in have or metrics is None or (value := metrics[have[column][0]]) is None:
        return NA
    return f"{value:.1f}" + ("" if have[column][1] == "%" else " MB/s")