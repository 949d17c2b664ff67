"""The summary's GPU-metric blocks (docs/PROFILING.md, "GPU metrics"; docs/summary.schema.json).

One pass over the export's samples places every value for every rank at once (gpu_metrics/place.py);
the result is kept with the trace's metrics source, so the ranks, the per-GPU table and the page
read it without a second pass.
"""
from typing import TYPE_CHECKING

import numpy as np

from handler.runtime.names import BATCH

from . import device_map
from .read import Chunk
from .place import BUSY, REGIONS, Owner, Sums, merged, owner, place

if TYPE_CHECKING:
    from ..trace import Trace

STEADY_STEPS = 4


def placed(trace) -> Sums | None:
    """The trace's samples placed on its ranks (computed once per trace)."""
    source = trace.metrics
    if source is None:
        return None
    found = source.cache.get("placed")
    if found is not None and found[0] is trace:
        return found[1]
    sums = place(source, [_owner(p, trace) for p in trace.processes], figure_window(trace))
    source.cache["placed"] = (trace, sums)
    return sums


def figure_window(trace: "Trace") -> tuple[int, int] | None:
    """A few steps from the middle of the first rank's steps: past warm-up, before the end (the lab's figure)."""
    steps = sorted((r for r in trace.processes[0].ranges if BATCH.match(r.name)), key=lambda r: r.start) \
        if trace.processes else []
    if not steps:
        return None
    first = max(0, len(steps) // 2 - STEADY_STEPS // 2)
    chosen = steps[first:first + STEADY_STEPS]
    after = steps[first + len(chosen)].start if first + len(chosen) < len(steps) else chosen[-1].end
    return chosen[0].start, after


def window_samples(trace: "Trace") -> Chunk | None:
    """The values inside figure_window, as they are; None without metrics."""
    sums = placed(trace)
    if sums is None:
        return None
    if not sums.kept:
        empty = np.empty(0, dtype=np.int64)
        return Chunk(empty, empty, empty, np.empty(0))
    return Chunk(np.concatenate([c.time for c in sums.kept]), np.concatenate([c.gpu for c in sums.kept]),
                 np.concatenate([c.key for c in sums.kept]), np.concatenate([c.value for c in sums.kept]))


def _owner(process, trace) -> Owner:
    gpu = trace.gpu.of_pid(process.pid) if trace.gpu is not None else None
    cudas = np.unique(gpu.device).tolist() if gpu is not None and len(gpu.pid) else []  # as gpu_view's devices
    gpus = device_map(process.pid, cudas, trace.cuda_devices).values()
    comm = []
    if gpu is not None and len(gpu.pid):
        nccl = gpu.is_nccl()
        comm = list(zip(gpu.start[nccl].tolist(), gpu.end[nccl].tolist()))
    return owner(process.rank, gpus, process.ranges, comm)


def _per_gpu(trace, process, value) -> dict | None:
    """{GPU id: value(sums, pair)} over the rank's GPUs whose value is not empty; None without metrics."""
    sums = placed(trace)
    if sums is None:
        return None
    o = _index(trace, process)
    return {str(g): found for p, (oi, g) in enumerate(sums.pairs) if oi == o and (found := value(sums, p))}


def rank_metrics(trace, process) -> dict | None:
    """{GPU id: {key: {mean, p95, samples}}} inside the rank's epochs; None without metrics."""
    return _per_gpu(trace, process, lambda sums, p: _stats(sums, p, "epochs"))


def rank_phase_metrics(trace, process) -> dict | None:
    """{GPU id: {region: {key: {mean, p95, samples}}}}: each phase, `other` and `comm`."""
    return _per_gpu(trace, process, lambda sums, p: {r: stats for r in REGIONS[1:] if (stats := _stats(sums, p, r))})


def rank_pcie_overlap(trace, process) -> dict | None:
    """{GPU id: {tx_busy_samples, both_busy_samples, share, busy_at}}: of the instants inside the epochs
    when PCIe TX was busy, the share when RX was busy too."""
    def overlap(sums, p: int) -> dict | None:
        if p not in sums.busy_unit:
            return None
        tx, both, unit = int(sums.tx_busy[p]), int(sums.both_busy[p]), sums.busy_unit[p]
        return {"tx_busy_samples": tx, "both_busy_samples": both, "share": both / tx if tx else None,
                "busy_at": f">= {BUSY[unit]:g} {'%' if unit == 'pct' else 'MB/s'}"}
    return _per_gpu(trace, process, overlap)


def unplaced(trace) -> dict | None:
    """How many values the report read and where those it could not place went, with one line each."""
    sums = placed(trace)
    if sums is None:
        return None
    source = trace.metrics
    total = sums.values + sums.unknown
    lines = []
    if sums.unknown:
        lines.append(f"{sums.unknown} GPU-metric values of a source this report does not know (no "
                     f"{'TARGET_INFO_GPU_METRICS' if source.layout == 'GPU_METRICS' else 'GENERIC_EVENT_TYPES'} "
                     "row names their metric) are left out")
    if sums.unused_gpu:
        used = sorted({g for o in sums.owners for g in o.gpus})
        lines.append(f"{sums.unused_gpu} GPU-metric values of GPUs no rank used (GPUs sampled: "
                     f"{', '.join(map(str, source.gpus))}; used: {', '.join(map(str, used)) or 'none'}) are left out")
    if sums.outside:
        lines.append(f"{sums.outside} GPU-metric values of the ranks' GPUs lie outside every epoch (before, "
                     "between or after them) and are left out")
    return {"layout": source.layout, "values": total, "placed": sums.placed, "unknown_source": sums.unknown,
            "unused_gpu": sums.unused_gpu, "outside_epochs": sums.outside, "not_reported": list(source.ignored),
            "lines": lines}


def device_means(trace, gpu_id, spans) -> dict:
    """{key: mean} of one GPU inside the given spans: the rank's pass where a rank owns the GPU over
    exactly these spans, else a pass of its own."""
    sums = placed(trace)
    if sums is None or gpu_id is None:
        return {}
    wanted = merged(spans)
    for p, (o, g) in enumerate(sums.pairs):
        if g == gpu_id and np.array_equal(sums.owners[o].epochs, wanted):
            return {k: s["mean"] for k, s in _stats(sums, p, "epochs").items()}
    alone = place(trace.metrics, [Owner(-1, (gpu_id,), wanted, np.empty(0, dtype=np.int64),
                                        np.empty(0, dtype=np.int64), np.empty((0, 2), dtype=np.int64))])
    return {k: s["mean"] for k, s in _stats(alone, 0, "epochs").items()}


def _stats(sums: Sums, pair: int, region: str) -> dict:
    return {key: stat for key in sums.keys if (stat := sums.stat(pair, key, region))}


def _index(trace, process) -> int:
    return next(i for i, p in enumerate(trace.processes) if p is process or p.pid == process.pid)

