"""The per-GPU view the lab's analysis asks for: busy shares, NCCL time, copies by kind, peak memory.

One entry per CUDA device that ran kernels, over the training epochs of the ranks that used
it (`gpus` in the summary, docs/PROFILING.md):
  kernel_busy_share   the union of its kernels' intervals inside those epochs, over their length;
  compute_busy_share  the same without NCCL kernels;
  memcpy              CUPTI_ACTIVITY_KIND_MEMCPY rows starting inside the epochs, by copyKind
                      (ENUM_CUDA_MEMCPY_OPER: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP; others "other");
  peak_memory_mb      the highest running sum of device allocations less frees in
                      CUDA_GPU_MEMORY_USAGE_EVENTS (recorded with --cuda-memory-usage); None without.
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from handler.runtime.names import EPOCH

from .columns import CHUNK, rowids
from .gpu_metrics.summary import device_means
from .sql_columns import read_columns
from .stats import length, merge, merge_arrays, overlap

MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
DEVICE_MEMORY = (2, 5)  # ENUM_CUDA_MEM_KIND: Device, Device Static
MB = 1e6
COPY = np.dtype([("device", "i2"), ("kind", "i2"), ("bytes", "i8"), ("start", "i8"), ("end", "i8")])


@dataclass(frozen=True, eq=False)
class Copies:
    rows: np.ndarray  # COPY records, in the export's order


def load_copies(db, tables: set, columns, export: Path) -> Copies | None:
    """The memcpy rows as columns (sql_columns), read in chunks of rowids straight into their records."""
    if MEMCPY not in tables or not {"copyKind", "bytes", "deviceId"} <= columns(db, MEMCPY):
        return None
    low, high = rowids(db, MEMCPY)
    if high < low:
        return None
    rows, at = np.empty(high - low + 1, dtype=COPY), 0
    for first in range(low, high + 1, CHUNK):
        read = read_columns(export, "SELECT deviceId AS device, copyKind AS kind, COALESCE(bytes, 0) AS bytes, start, "
                            f"end FROM {MEMCPY} WHERE rowid >= {first} AND rowid < {first + CHUNK} ORDER BY rowid",
                            {name: "i8" for name in COPY.names or ()})
        for name in COPY.names or ():
            rows[name][at:at + len(read["start"])] = read[name]
        at += len(read["start"])
    return Copies(rows[:at]) if at else None


def load_peaks(db, tables: set, columns, export: Path) -> dict | None:
    """CUDA device -> the peak of its allocated device memory in bytes; None: not recorded."""
    if MEMORY not in tables or not {"deviceId", "bytes", "memKind", "memoryOperationType"} <= columns(db, MEMORY):
        return None
    kinds = ",".join(map(str, DEVICE_MEMORY))
    events = read_columns(export, "SELECT deviceId AS device, CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes "
                          f"END AS change FROM {MEMORY} WHERE memKind IN ({kinds}) AND bytes IS NOT NULL "
                          "ORDER BY start", {"device": "i8", "change": "i8"})  # 0 allocation, 1 free
    peaks = {}
    for device in np.unique(events["device"]).tolist():
        running = np.cumsum(events["change"][events["device"] == device])
        peaks[device] = max(0, int(running.max()))
    return peaks or None


def gpu_table(trace) -> list[dict] | None:
    """The summary's `gpus` list; None for a CPU-only profile."""
    gpu = trace.gpu
    if gpu is None:
        return None
    kernel = gpu.is_kernel()
    nccl = gpu.is_nccl()
    spans_of = {}  # device -> the epochs of the ranks that ran kernels on it
    processes = trace.processes
    for process in processes:
        epochs = [(r.start, r.end) for r in process.ranges if EPOCH.match(r.name)]
        own = gpu.of_pid(process.pid)
        for device in np.unique(own.device[own.is_kernel()]).tolist():
            spans_of.setdefault(device, []).extend(epochs)
    table = []
    for device, spans in sorted(spans_of.items()):
        spans = merge(spans)
        span_ns = length(spans)
        on = kernel & (gpu.device == device)
        busy = overlap(spans, merge_arrays(gpu.start[on], gpu.end[on]))
        on &= ~nccl
        compute = overlap(spans, merge_arrays(gpu.start[on], gpu.end[on]))
        rows = np.flatnonzero(kernel & nccl & (gpu.device == device))
        rows = rows[_inside(gpu.start[rows], spans)]
        nccl_ns = int((gpu.end[rows] - gpu.start[rows]).sum())
        table.append({"device": device, "kernel_busy_share": busy / span_ns if span_ns else None,
                      "compute_busy_share": compute / span_ns if span_ns else None,
                      "kernel_busy_s": busy / 1e9, "epochs_s": span_ns / 1e9, "nccl_kernel_s": nccl_ns / 1e9,
                      "memcpy": _copies(trace.copies, device, spans),
                      "peak_memory_mb": _peak_mb(trace.memory_peaks, device),
                      "metrics": _metrics(trace, processes, device, spans)})
    return table


def _peak_mb(peaks: dict | None, device: int) -> float | None:
    return peaks[device] / MB if peaks and device in peaks else None


def _inside(starts: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Which times fall inside one of the merged spans [start, end)."""
    if not spans:
        return np.zeros(len(starts), dtype=bool)
    begins = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    at = np.searchsorted(begins, starts, side="right") - 1
    return (at >= 0) & (starts < ends[np.maximum(at, 0)])


def _copies(copies: Copies | None, device: int, spans) -> dict:
    if copies is None:
        return {}
    rows = copies.rows[(copies.rows["device"] == device) & _inside(copies.rows["start"], spans)]
    names = np.array([COPY_KINDS.get(k, "other") for k in rows["kind"].tolist()], dtype=object)
    out = {}
    for kind in [*COPY_KINDS.values(), "other"]:
        pick = rows[names == kind] if len(rows) else rows
        if len(pick):
            out[kind] = {"count": int(len(pick)), "mb": int(pick["bytes"].sum()) / MB,
                         "seconds": int((pick["end"] - pick["start"]).sum()) / 1e9}
    return out


def _metrics(trace, processes, device: int, spans) -> dict | None:
    """{key: mean} of the GPU metrics sampled on this device inside the epochs. Metrics are keyed
    by nsys' GPU id: TARGET_INFO_CUDA_DEVICE maps a process's CUDA device to it; without that
    table the two are taken to be equal (the summary's gpu_metrics_mapping says so)."""
    if not trace.metrics:
        return None
    gpu_id = device
    if trace.cuda_devices is not None:
        gpu_id = next((trace.cuda_devices[(p.pid, device)] for p in processes
                       if (p.pid, device) in trace.cuda_devices), None)
    return device_means(trace, gpu_id, spans)
