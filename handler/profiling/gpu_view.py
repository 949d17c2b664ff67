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

from .stats import intersect, length, merge
from .trace import Range

NCCL = "nccl"
DATA_GPU = "data_gpu"
# DALI names its threads "[DALI][WT]", "[DALI][TP0]", ... and marks its work with "[DALI]..." ranges.
DALI_MARK = "[DALI]"
DALI_KERNEL = re.compile(r"\b(dali|nvjpeg|nvimgcodec)::")


class PhaseLookup:
    """Innermost phase range open at a time, per thread; ranges on one thread nest (push/pop)."""

    def __init__(self, phase_ranges: Iterable[Range]):
        self.by_thread: dict[int, list[Range]] = {}
        for r in sorted(phase_ranges, key=lambda r: (r.start, -r.end)):
            self.by_thread.setdefault(r.tid, []).append(r)
        self.parents = {tid: _parents(rs) for tid, rs in self.by_thread.items()}
        self.starts = {tid: [r.start for r in rs] for tid, rs in self.by_thread.items()}

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


def _parents(ranges) -> list[int]:
    parents, stack = [], []
    for i, r in enumerate(ranges):
        while stack and ranges[stack[-1]].end <= r.start:
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        stack.append(i)
    return parents


def pipeline_threads(process, thread_names: dict) -> set[int]:
    """The process's input-pipeline threads: named `[DALI]...` by DALI, or opening DALI's `[DALI]...` ranges."""
    named = {tid for tid, names in thread_names.items()
             if (tid >> 24) & 0xFFFFFF == process.pid and any(n.startswith(DALI_MARK) for n in names)}
    return named | {r.tid for r in process.ranges if r.name.startswith(DALI_MARK)}


def is_pipeline_kernel(activity) -> bool:
    return bool(activity.full_name and DALI_KERNEL.search(activity.full_name))


def gpu_stats(activity, phase_ranges, phases, epochs, training_tid, batches=(), pipeline_tids: AbstractSet[int] = frozenset()) -> dict:
    """activity: this rank's GpuActivity; phase_ranges: phase ranges inside batches;
    epochs: the rank's epoch ranges; training_tid: the thread holding the batch ranges;
    batches: its batch ranges; pipeline_tids: the input pipeline's threads (pipeline_threads)."""
    lookup = PhaseLookup(phase_ranges)
    kernels = [a for a in activity if a.name is not None]
    kernel_s = sum(a.end - a.start for a in kernels) / 1e9
    nccl_s = sum(a.end - a.start for a in kernels if NCCL in a.name.lower()) / 1e9
    phase_ns = {p: 0 for p in (*phases, DATA_GPU)}
    in_batch = _Spans(merge((b.start, b.end) for b in batches))
    unattributed = 0
    for a in activity:
        phase = None
        if a.launched is not None:
            if a.tid in lookup.by_thread and not is_pipeline_kernel(a):
                phase = lookup.phase(a.tid, a.launched)
            elif a.tid in pipeline_tids or is_pipeline_kernel(a):
                phase = DATA_GPU if in_batch.holds(a.launched) else None
            else:
                phase = lookup.phase(training_tid, a.launched)
        if phase in phase_ns:
            phase_ns[phase] += a.end - a.start
        else:
            unattributed += a.end - a.start
    devices = sorted({a.device for a in activity})
    spans = merge((r.start, r.end) for r in epochs)
    capacity = length(spans) * len(devices)
    busy = {d: intersect(merge((a.start, a.end) for a in activity if a.device == d), spans) for d in devices}
    idle_ns = capacity - sum(length(b) for b in busy.values())
    data = intersect(merge((r.start, r.end) for r in phase_ranges if r.name == "data"), spans)
    stall_ns = sum(length(data) - length(intersect(data, b)) for b in busy.values())
    return {"kernel_time_s": kernel_s, "nccl_time_s": nccl_s, "kernels": len(kernels), "devices": devices,
            "activity_s": sum(a.end - a.start for a in activity) / 1e9,
            "training_s": capacity / 1e9 if devices else None,
            "idle_s": idle_ns / 1e9 if devices else None,
            "idle_share": idle_ns / capacity if capacity else None,
            "nccl_share": nccl_s / kernel_s if kernel_s else None,
            "phase_kernel_s": {p: ns / 1e9 for p, ns in phase_ns.items()},
            "unattributed_s": unattributed / 1e9,
            "data_stall_s": stall_ns / 1e9 if devices else None,
            "data_stall_share": stall_ns / capacity if capacity else None,
            "data_gpu_share": phase_ns[DATA_GPU] / capacity if capacity else None,
            "pipeline_threads": len(pipeline_tids)}


class _Spans:
    """Whether a time falls inside merged, sorted [start, end) spans."""

    def __init__(self, spans):
        self.spans, self.starts = spans, [s for s, _ in spans]

    def holds(self, time: int) -> bool:
        i = bisect.bisect_right(self.starts, time) - 1
        return i >= 0 and time < self.spans[i][1]
