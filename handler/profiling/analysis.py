"""Per-rank numbers from the NVTX ranges of DESIGN.md §4 (and CUDA activity on GPU runs).

A phase counts only inside a `batch` range, so evaluation's forward passes, say, never
inflate training shares. Shares are of summed batch time; what no phase covers is "other".
"""
import bisect
import re

from .bubble import pipeline_stats
from .trace import EPOCH, GpuActivity, Process, Range, Trace

PHASES = ("data", "h2d", "forward", "backward", "optimizer")
OUTSIDE_TRAINING = ("validate", "test", "checkpoint")
BATCH = re.compile(r"batch \d+")


def summarize(trace: Trace, metrics: dict | None = None) -> dict:
    ranks = [_rank(p, trace.gpu) for p in trace.processes]
    for rank, stage in zip(ranks, pipeline_stats(trace.processes)):  # pp runs only; else None
        rank["pipeline"] = stage
    summary = {"schema": 1, "rank_source": trace.rank_source, "gpu_trace": trace.gpu is not None,
               "ranks": ranks, "overall": _overall(ranks)}
    summary["metrics_comparison"] = _compare(ranks[0], metrics) if metrics else None
    return summary


def _rank(process: Process, gpu: tuple[GpuActivity, ...] | None) -> dict:
    epochs = sorted((int(EPOCH.fullmatch(r.name).group(1)), r) for r in process.ranges
                    if EPOCH.fullmatch(r.name))
    batches = sorted((r for r in process.ranges if BATCH.fullmatch(r.name)), key=lambda r: r.start)
    batch_total = sum(b.seconds for b in batches)
    phase_time = _phase_seconds(process.ranges, batches)
    span = (epochs[0][1].start, max(r.end for _, r in epochs)) if epochs else None
    return {
        "rank": process.rank, "pid": process.pid,
        "epochs": [{"epoch": e, "time_s": r.seconds} for e, r in epochs],
        "batches": _batch_stats([b.seconds for b in batches]),
        "phases": {name: {"count": phase_time[name][0], "total_s": phase_time[name][1],
                          "share": _ratio(phase_time[name][1], batch_total)} for name in PHASES},
        "other_share": _ratio(batch_total - sum(t for _, t in phase_time.values()), batch_total),
        "outside_training": {name: _totals([r for r in process.ranges if r.name == name])
                             for name in OUTSIDE_TRAINING},
        "gpu": _gpu_stats([a for a in gpu if a.pid == process.pid], span) if gpu is not None else None,
    }


def _phase_seconds(ranges: tuple[Range, ...], batches: list[Range]) -> dict:
    """name -> (count, seconds) of the phase ranges that lie inside some batch."""
    starts = [b.start for b in batches]
    found = {name: (0, 0.0) for name in PHASES}
    for r in ranges:
        if r.name in found:
            i = bisect.bisect_right(starts, r.start) - 1
            if i >= 0 and r.end <= batches[i].end:
                count, seconds = found[r.name]
                found[r.name] = (count + 1, seconds + r.seconds)
    return found


def _totals(ranges: list[Range]) -> dict:
    return {"count": len(ranges), "total_s": sum(r.seconds for r in ranges)}


def _batch_stats(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    stats = {"count": len(ms), "total_s": sum(seconds), "mean_ms": sum(ms) / len(ms) if ms else None}
    stats.update({f"p{q}_ms": _percentile(ms, q) for q in (50, 95, 99)})
    return stats


def _percentile(ordered: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _gpu_stats(activity: list[GpuActivity], span: tuple[int, int] | None) -> dict:
    kernels = [a for a in activity if a.name is not None]
    kernel_s = sum(a.end - a.start for a in kernels) / 1e9
    nccl_s = sum(a.end - a.start for a in kernels if "nccl" in a.name.lower()) / 1e9
    devices = sorted({a.device for a in activity})
    idle = None
    if span and devices:
        busy = sum(_covered([(a.start, a.end) for a in activity if a.device == d], span) for d in devices)
        idle = 1 - busy / ((span[1] - span[0]) * len(devices))
    return {"kernel_time_s": kernel_s, "nccl_time_s": nccl_s, "kernels": len(kernels), "devices": devices,
            "idle_share": idle, "nccl_share": _ratio(nccl_s, kernel_s)}


def _covered(intervals: list[tuple[int, int]], span: tuple[int, int]) -> int:
    """Nanoseconds of span covered by the union of the intervals."""
    total, reach = 0, span[0]
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, span[1])
        if end > start:
            total += end - start
            reach = end
    return total


def _overall(ranks: list[dict]) -> dict:
    """All ranks pooled, for the one-line summary; epoch time is the first rank's mean and
    GPU idle the mean over ranks (each rank has its own GPUs and span)."""
    batch_total = sum(r["batches"]["total_s"] for r in ranks)
    first = ranks[0]["epochs"]
    gpus = [r["gpu"] for r in ranks if r["gpu"]]
    return {
        "ranks": len(ranks),
        "phase_shares": {name: _ratio(sum(r["phases"][name]["total_s"] for r in ranks), batch_total)
                         for name in PHASES},
        "epoch_mean_s": _mean([e["time_s"] for e in first]),
        "gpu_idle_share": _mean([g["idle_share"] for g in gpus if g["idle_share"] is not None]),
        "nccl_share": _ratio(sum(g["nccl_time_s"] for g in gpus), sum(g["kernel_time_s"] for g in gpus)),
    }


def _compare(rank0: dict, metrics: dict) -> list[dict]:
    """nsys `epoch e` on the first rank vs the metrics' epochs[].time_s (rank 0's timer).

    Epochs are matched by number, so a resumed run's earlier epochs are skipped.
    """
    nsys = {e["epoch"]: e["time_s"] for e in rank0["epochs"]}
    rows = []
    for i, entry in enumerate(metrics.get("epochs") or []):
        epoch, timed = entry.get("epoch", i), entry.get("time_s")
        if epoch in nsys and timed:
            rows.append({"epoch": epoch, "nsys_s": nsys[epoch], "metrics_s": timed,
                         "diff_share": (nsys[epoch] - timed) / timed})
    return rows


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
