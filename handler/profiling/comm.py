"""Gradient communication per rank, and stragglers across ranks (what Holistic Trace Analysis
computes from PyTorch profiler traces, here from nsys and on CPU too).

Comm intervals: on a GPU trace the NCCL kernels (the GPU time the all-reduce really takes);
on a CPU trace the `allreduce b{k}` ranges of handler/DDP/comm_hook.py, from a bucket's
launch to its completion.
Compute it can hide behind: on a GPU the other kernels; on a CPU the backward pass up to
the launch of its last bucket (DDP launches a bucket once its gradients are ready, so the
last launch is where backward compute ends and the wait for the all-reduce begins).
"""
import bisect

import numpy as np

from handler.runtime.names import ALLREDUCE, BACKWARD

from .stats import as_list, intersect, length, merge, merge_arrays, overlap, percentile


def comm_stats(ranges, batches, activity) -> dict | None:
    """ranges: the rank's NVTX ranges; batches: its batch ranges (sorted); activity: its GpuColumns or None."""
    buckets = [r for r in ranges if ALLREDUCE.match(r.name)]
    nccl = activity.is_nccl() if activity is not None else None
    if not buckets and (nccl is None or not nccl.any()):
        return None
    batch_spans = merge((b.start, b.end) for b in batches)
    if activity is not None and nccl is not None and nccl.any():
        source = "nccl kernels"
        comm = intersect(as_list(merge_arrays(activity.start[nccl], activity.end[nccl])), batch_spans)
        work = activity.named() & ~nccl
        overlap_ns = overlap(comm, merge_arrays(activity.start[work], activity.end[work]))
    else:
        source = "allreduce ranges"
        comm = intersect(merge((r.start, r.end) for r in buckets), batch_spans)
        overlap_ns = length(intersect(comm, merge(_backward_compute(ranges, buckets))))
    comm_ns = length(comm)
    batch_ns = length(batch_spans)
    return {"source": source, "seconds": comm_ns / 1e9, "share": comm_ns / batch_ns if batch_ns else None,
            "overlap_share": overlap_ns / comm_ns if comm_ns else None,
            "exposed_s": (comm_ns - overlap_ns) / 1e9,
            "buckets": len({m.group(1) for r in buckets if (m := ALLREDUCE.match(r.name))}),
            "allreduce_ranges": len(buckets)}


def _backward_compute(ranges, buckets):
    """Each backward range cut at the launch of the last bucket inside it."""
    starts = sorted(r.start for r in buckets)
    for r in ranges:
        if r.name == BACKWARD:
            inside = [s for s in starts if r.start <= s < r.end]
            yield (r.start, inside[-1] if inside else r.end)


def first_comm_starts(ranges, batches, activity) -> dict:
    """(epoch-ordinal, batch name) -> start of the first all-reduce inside that batch.

    The first bucket's launch (NVTX) is when a rank reached the end of its first layers'
    backward; without the ranges, a GPU trace's first NCCL kernel stands in."""
    starts = sorted(r.start for r in ranges if ALLREDUCE.match(r.name))
    if not starts and activity is not None:
        starts = np.sort(activity.start[activity.is_nccl()]).tolist()
    found = {}
    for key, batch in batches:
        i = bisect.bisect_left(starts, batch.start)
        if i < len(starts) and starts[i] < batch.end:
            found[key] = starts[i]
    return found


def stragglers(per_rank: dict) -> dict | None:
    """per_rank: rank -> {step: first all-reduce start}. Per step seen on every rank: the
    spread (latest - earliest) and the rank that arrived last."""
    if len(per_rank) < 2:
        return None
    steps = set.intersection(*(set(s) for s in per_rank.values()))
    if not steps:
        return None
    spreads, last = [], {str(r): 0 for r in per_rank}
    for step in sorted(steps):
        arrivals = {r: s[step] for r, s in per_rank.items()}
        spreads.append((max(arrivals.values()) - min(arrivals.values())) / 1e6)
        last[str(max(arrivals, key=lambda r: arrivals[r]))] += 1
    spreads.sort()
    return {"steps": len(spreads), "p50_ms": percentile(spreads, 50), "p95_ms": percentile(spreads, 95),
            "max_ms": spreads[-1], "last_rank_counts": last,
            "most_often_last": int(max(last, key=lambda r: last[r]))}
