"""The GPU side of a rank: which phase launched each kernel, copy and memset, and when the GPU idles.

On a GPU the `forward`/`backward`/`optimizer` ranges time only the CPU's launches; the
kernels run later. So GPU time is attributed to the phase range that was innermost-open on
the launching thread when its CUDA runtime call started (linked by correlationId).
Launches from a thread that never opens a phase (an autograd device thread, an NCCL helper
thread) take the phase open on the training thread at that moment, except the input
pipeline's own GPU work (DALI's operators, nvJPEG), which is `data_gpu`: launched by a DALI
thread, or a kernel in the `dali::`, `nvjpeg::` or `nvimgcodec::` namespace. Like every
phase it counts only launches made while the training thread is inside a `batch`.
"""
import bisect
import re
from typing import AbstractSet, Iterable

import numpy as np

from .columns import GpuColumns
from handler.runtime.names import DATA, DATA_GPU

from .stats import intersect, length, merge, merge_arrays, nesting_parents, overlap, subtract
from .trace import Range

NCCL = "nccl"
# DALI names its threads "[DALI][WT]", "[DALI][TP0]", ... and marks its work with "[DALI]..." ranges.
DALI_MARK = "[DALI]"
DALI_KERNEL = re.compile(r"\b(dali|nvjpeg|nvimgcodec)::")


class PhaseLookup:
    """Innermost phase range open at a time, per thread; ranges on one thread nest (push/pop)."""

    def __init__(self, phase_ranges: Iterable[Range]):
        self.by_thread: dict[int, list[Range]] = {}
        for r in sorted(phase_ranges, key=lambda r: (r.start, -r.end)):
            self.by_thread.setdefault(r.tid, []).append(r)
        self.parents = {tid: nesting_parents(rs) for tid, rs in self.by_thread.items()}
        self.starts = {tid: [r.start for r in rs] for tid, rs in self.by_thread.items()}
        self.arrays = {tid: (np.array(self.starts[tid], dtype=np.int64), np.array([r.end for r in rs], dtype=np.int64),
                             np.array(self.parents[tid], dtype=np.int64)) for tid, rs in self.by_thread.items()}

    def phase(self, tid: int, time: int) -> str | None:
        found = self.innermost(tid, time)
        return found.name if found else None

    def innermost(self, tid: int, time: int) -> Range | None:
        ranges = self.by_thread.get(tid)
        if ranges is None:
            return None
        i = bisect.bisect_right(self.starts[tid], time) - 1
        while i >= 0 and ranges[i].end <= time:
            i = self.parents[tid][i]
        return ranges[i] if i >= 0 else None

    def innermost_many(self, tid, times: np.ndarray) -> np.ndarray:
        """innermost() for many times on one thread: indexes into by_thread[tid], -1 for none."""
        if tid not in self.arrays:
            return np.full(len(times), -1, dtype=np.int64)
        starts, ends, parents = self.arrays[tid]
        i = np.searchsorted(starts, times, side="right") - 1
        closed = (i >= 0) & (ends[np.maximum(i, 0)] <= times)
        while closed.any():  # climb to the parent; as many rounds as ranges nest
            i[closed] = parents[i[closed]]
            closed = (i >= 0) & (ends[np.maximum(i, 0)] <= times)
        return i


def pipeline_threads(process, thread_names: dict) -> set[int]:
    """The process's input-pipeline threads: named `[DALI]...` by DALI, or opening DALI's `[DALI]...` ranges."""
    named = {tid for tid, names in thread_names.items()
             if (tid >> 24) & 0xFFFFFF == process.pid and any(n.startswith(DALI_MARK) for n in names)}
    return named | {r.tid for r in process.ranges if r.name.startswith(DALI_MARK)}


def gpu_stats(activity: GpuColumns, phase_ranges, phases, epochs, training_tid, batches=(),
              pipeline_tids: AbstractSet[int] = frozenset()) -> dict:
    """activity: this rank's GPU activity; phase_ranges: phase ranges inside batches;
    epochs: the rank's epoch ranges; training_tid: the thread holding the batch ranges;
    batches: its batch ranges; pipeline_tids: the input pipeline's threads (pipeline_threads)."""
    duration, kernel = activity.duration, activity.is_kernel()
    kernel_ns = int(duration[kernel].sum())
    nccl_ns = int(duration[kernel & activity.is_nccl()].sum())
    names = (*phases, DATA_GPU)
    phase = _phases(activity, PhaseLookup(phase_ranges), names, training_tid, batches, pipeline_tids)
    phase_ns = {p: int(duration[phase == k].sum()) for k, p in enumerate(names)}
    unattributed = int(duration.sum()) - sum(phase_ns.values())
    devices = sorted(set(np.unique(activity.device).tolist()))
    spans = merge((r.start, r.end) for r in epochs)
    capacity = length(spans) * len(devices)
    busy = {d: merge_arrays(activity.start, activity.end) if len(devices) == 1 else
            merge_arrays(activity.start[activity.device == d], activity.end[activity.device == d]) for d in devices}
    idle_ns = capacity - sum(overlap(spans, b) for b in busy.values())
    # The training thread waiting for data, less the copy (`h2d`) nested in it since the loop's
    # `data` phase holds the loader's copy.
    data = intersect(subtract(merge((r.start, r.end) for r in phase_ranges if r.name == DATA),
                              merge((r.start, r.end) for r in phase_ranges if r.name != DATA)), spans)
    stall_ns = sum(length(data) - overlap(data, b) for b in busy.values())
    return {"kernel_time_s": kernel_ns / 1e9, "nccl_time_s": nccl_ns / 1e9, "kernels": int(kernel.sum()),
            "devices": devices, "activity_s": int(duration.sum()) / 1e9,
            "training_s": capacity / 1e9 if devices else None,
            "idle_s": idle_ns / 1e9 if devices else None,
            "idle_share": idle_ns / capacity if capacity else None,
            "nccl_share": (nccl_ns / 1e9) / (kernel_ns / 1e9) if kernel_ns else None,  # as before, bit for bit
            "phase_kernel_s": {p: ns / 1e9 for p, ns in phase_ns.items()},
            "unattributed_s": unattributed / 1e9,
            "data_stall_s": stall_ns / 1e9 if devices else None,
            "data_stall_share": stall_ns / capacity if capacity else None,
            "data_gpu_share": phase_ns[DATA_GPU] / capacity if capacity else None,
            "pipeline_threads": len(pipeline_tids)}


def _phases(activity: GpuColumns, lookup: PhaseLookup, names: tuple, training_tid, batches,
            pipeline_tids) -> np.ndarray:
    """Per row: the index in names of the phase that launched it, -1 for none (see the module doc)."""
    phase = np.full(len(activity), -1, dtype=np.int8)
    linked, pipeline_kernel = activity.linked, activity.full_matches(DALI_KERNEL)
    own = linked & activity.of_threads(lookup.by_thread) & ~pipeline_kernel
    for tid in lookup.by_thread:
        _assign(phase, own & activity.of_threads((tid,)), lookup, tid, activity.launched, names)
    pipeline = linked & ~own & (activity.of_threads(pipeline_tids) | pipeline_kernel)
    spans = merge((b.start, b.end) for b in batches)
    starts, ends = (np.array([s[k] for s in spans], dtype=np.int64) for k in (0, 1))
    rows = np.flatnonzero(pipeline)  # few: only theirs are looked up
    at = np.searchsorted(starts, activity.launched[rows], side="right") - 1
    in_batch = (at >= 0) & (activity.launched[rows] < ends[np.maximum(at, 0)]) if spans else np.zeros(len(at), bool)
    phase[rows[in_batch]] = names.index(DATA_GPU)
    _assign(phase, linked & ~own & ~pipeline, lookup, training_tid, activity.launched, names)
    return phase


def _assign(phase: np.ndarray, rows: np.ndarray, lookup: PhaseLookup, tid, launched: np.ndarray, names) -> None:
    if tid not in lookup.by_thread or not rows.any():
        return
    found = lookup.innermost_many(tid, launched[rows])
    index = np.array([names.index(r.name) if r.name in names else -1 for r in lookup.by_thread[tid]] + [-1])
    phase[rows] = index[found]  # found == -1 picks the trailing -1
