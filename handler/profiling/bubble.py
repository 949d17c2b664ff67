"""The pipeline bubble per stage, from the pp NVTX ranges (docs/PROFILING.md).

Inside each training batch, a stage's pipeline span runs from its first `fwd mb{j}`,
`bwd mb{j}`, `send` or `recv` range to its last one. Busy is the time in `fwd`/`bwd`
ranges; the bubble is the rest of the span (waiting for a neighbour, sending), so
busy + bubble = 1. Theory for W stages and M equal micro-batches: (W-1)/(M+W-1), the
same for GPipe and 1F1B (1F1B saves activation memory, not bubble).

On a GPU trace those ranges time the launches: NCCL's wait() only makes the stream wait,
so the CPU runs ahead. There the numbers come from the stage's GPU activity instead
(`source: "gpu kernels"`), tied to a batch and a range by launch as the phases are
(gpu_view): everything launched inside the batch's pp ranges spans the pipeline, from
the first to the last to finish; busy is the union of the non-NCCL work launched in
`fwd`/`bwd`; wait is NCCL time (send/recv kernels spinning for the neighbour) not
overlapped by it. The CPU numbers stay beside them under `cpu_ranges`.
"""
import bisect

import numpy as np

from handler.runtime.names import BATCH, PP_WAIT as WAIT, PP_WORK

from .columns import GpuColumns
from .gpu_view import PhaseLookup
from .stats import as_list, length, merge_arrays, overlap
from .trace import Process

NOT_LINKED = "no GPU activity is linked to the pp ranges (the export lacks runtime calls or correlation ids)"


def theoretical_bubble(stages: int, microbatches: int) -> float:
    return (stages - 1) / (microbatches + stages - 1)


def _microbatch(name: str) -> int | None:
    """j of a `fwd mb{j}` or `bwd mb{j}` range; None for any other range."""
    for work in PP_WORK:
        if found := work.match(name):
            return int(found.group(1))
    return None


def pipeline_stats(processes: tuple[Process, ...], gpu=None) -> list[dict | None]:
    """One entry per process (same order): its pipeline numbers, or None without pp ranges.
    gpu: the trace's GPU activity (None on CPU-only traces)."""
    stages = [p for p in processes if any(_microbatch(r.name) is not None for r in p.ranges)]
    if not stages:
        return [None] * len(processes)
    microbatches = 1 + max(j for p in stages for r in p.ranges if (j := _microbatch(r.name)) is not None)
    theory = theoretical_bubble(len(stages), microbatches)
    return [_stage(p, stages.index(p), theory, microbatches, gpu) if p in stages else None for p in processes]


def _stage(process: Process, index: int, theory: float, microbatches: int, gpu) -> dict:
    pieces = sorted((r for r in process.ranges if r.name in WAIT or _microbatch(r.name) is not None),
                    key=lambda r: r.start)
    batches = sorted((r for r in process.ranges if BATCH.match(r.name)), key=lambda r: r.start)
    head = {"stage": index, "theoretical_bubble_share": theory, "microbatches": microbatches}
    cpu = _cpu_view(pieces, batches)
    if gpu is None:
        return {**head, **cpu, "source": "cpu ranges"}
    on_gpu = _gpu_view(pieces, batches, gpu.of_pid(process.pid))
    if on_gpu is None:
        return {**head, **cpu, "source": "cpu ranges", "note": NOT_LINKED}
    return {**head, **on_gpu, "source": "gpu kernels", "cpu_ranges": cpu}


def _shares(span: int, busy: int, wait: int) -> dict:
    return {"busy_share": busy / span if span else None, "bubble_share": 1 - busy / span if span else None,
            "wait_share": wait / span if span else None, "span_s": span / 1e9}


def _cpu_view(pieces, batches) -> dict:
    starts = [r.start for r in pieces]
    span = busy = wait = 0
    for batch in batches:
        inside = [r for r in pieces[bisect.bisect_left(starts, batch.start):bisect.bisect_right(starts, batch.end)]
                  if r.end <= batch.end]
        if inside:
            span += max(r.end for r in inside) - inside[0].start
            busy += sum(r.end - r.start for r in inside if r.name not in WAIT)
            wait += sum(r.end - r.start for r in inside if r.name in WAIT)
    return _shares(span, busy, wait)


def _gpu_view(pieces, batches, activity: GpuColumns) -> dict | None:
    """Each activity row goes to the pp range innermost-open on its launching thread (or, from a
    thread without pp ranges such as autograd's, on the training thread), and so to a batch."""
    if not pieces or not batches:
        return None
    lookup, training = PhaseLookup(pieces), batches[0].tid
    starts = [b.start for b in batches]
    batch = np.full(len(activity), -1, dtype=np.int64)
    compute = np.zeros(len(activity), dtype=bool)
    own = activity.of_threads(lookup.by_thread)
    for tid in lookup.by_thread:
        rows = activity.linked & (activity.of_threads((tid,)) | (~own if tid == training else False))
        found = lookup.innermost_many(tid, activity.launched[rows])
        of_piece = np.array([_batch_of(r, starts, batches) for r in lookup.by_thread[tid]] + [-1], dtype=np.int64)
        work = np.array([r.name not in WAIT for r in lookup.by_thread[tid]] + [False])
        batch[rows], compute[rows] = of_piece[found], work[found]
    if not (batch >= 0).any():
        return None
    span = busy = wait = 0
    nccl = activity.is_nccl()
    order = np.argsort(batch, kind="stable")
    bounds = np.searchsorted(batch[order], np.arange(-1, len(batches) + 1))
    for i in range(len(batches)):
        rows = order[bounds[i + 1]:bounds[i + 2]]
        if not len(rows):
            continue
        start, end, is_nccl = activity.start[rows], activity.end[rows], nccl[rows]
        span += int(end.max() - start.min())
        comm = as_list(merge_arrays(start[is_nccl], end[is_nccl]))
        work = merge_arrays(start[compute[rows] & ~is_nccl], end[compute[rows] & ~is_nccl])
        busy += int((work[1] - work[0]).sum())
        wait += length(comm) - overlap(comm, work)
    return _shares(span, busy, wait)


def _batch_of(piece, starts: list[int], batches) -> int:
    i = bisect.bisect_right(starts, piece.start) - 1
    return i if i >= 0 and piece.end <= batches[i].end else -1


def markdown_lines(ranks: list[dict], who=lambda r: str(r["rank"])) -> list[str]:
    """The report's pipeline section; empty for runs without pp ranges. `who` names a rank."""
    rows = [r["pipeline"] for r in ranks if r.get("pipeline")]
    if not rows:
        return []
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    lines = ["## Pipeline (pp)", "",
             "Shares of each stage's pipeline span inside the training batches; the bubble is idle "
             "time (waiting in send/recv included); theory is (W-1)/(M+W-1). Source `gpu kernels`: "
             "measured on the GPU from the work each pp range launched (CPU ranges in brackets); "
             "`cpu ranges`: the NVTX ranges themselves, which on a GPU time only the launches.", "",
             "| rank | stage | source | busy | bubble | theoretical bubble | send/recv |", "|" + "---|" * 7]
    for r in ranks:
        p = r.get("pipeline")
        if p:
            cpu = p.get("cpu_ranges")
            also = (lambda k: f" ({pct(cpu[k])})") if cpu else (lambda k: "")  # noqa: E731
            lines.append(f"| {who(r)} | {p['stage']} | {p['source']} | {pct(p['busy_share'])}{also('busy_share')} | "
                         f"{pct(p['bubble_share'])}{also('bubble_share')} | {pct(p['theoretical_bubble_share'])} | "
                         f"{pct(p['wait_share'])}{also('wait_share')} |")
    notes = sorted({p["note"] for p in rows if p.get("note")})
    return lines + [""] + [f"Note: {n}; the numbers above are CPU ranges." for n in notes] + ([""] if notes else [])
