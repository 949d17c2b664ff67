"""GPU metric samples placed on a rank's GPUs, epochs and phases, summed as they stream by (docs/PROFILING.md).

A rank owns the nsys GPU ids of its CUDA devices (gpu_metrics.device_map). Each value on one of them
counts inside the rank's epochs, and there in exactly one region: the phase range that holds it and
started last (`h2d` nested in `data` counts as `h2d`, as the phase shares count own time), or
`other` (inside the epochs, in no phase: between the steps, say). `comm` is laid over them: a value
inside one of the rank's NCCL kernels counts there too. A value is unplaced when its GPU is no
rank's (`unused_gpu`), when it lies outside every epoch of the ranks owning its GPU
(`outside_epochs`), or when the export's tables do not name its metric (`unknown_source`).

Means are exact sums. p95 comes from a histogram per (rank, GPU, metric, region) of 10,001 bins:
percentages in steps of 0.1 %-points from 0 to 1000 % (DRAM read + write can pass 100 %), rates (MB/s) in steps of 0.23 % from 0.01 to 10^8 MB/s; an
order statistic is read as the mean of the values in its bin (exact where a bin holds one distinct
value, as for the integers nsys writes), and between two it interpolates as numpy does.
"""
import heapq
from dataclasses import dataclass

import numpy as np

from handler.runtime.names import BATCH, EPOCH, PHASES

from . import KEYS, MetricsSource
from .joint import Joint
from .read import Chunk, chunks

REGIONS = ("epochs", *PHASES, "other", "comm")
OTHER, COMM = REGIONS.index("other"), REGIONS.index("comm")
BINS = 10_001
RATE_LOW, RATE_STEP = 0.01, np.log(1e10) / (BINS - 1)  # MB/s bins: 0.01 * e^(k * step)
BUSY = {"pct": 5.0, "mbps": 500.0}  # PCIe busy: at least 5 % of the link, or 500 MB/s where nsys gives a rate


@dataclass(frozen=True)
class Owner:
    """Where one rank's values count: its GPUs, merged epochs, phase segments and NCCL kernels."""
    rank: int
    gpus: tuple[int, ...]
    epochs: np.ndarray  # (n, 2) int64, merged, sorted
    cuts: np.ndarray  # segment starts; each segment's phase in `labels` (-1: none)
    labels: np.ndarray
    comm: np.ndarray  # (m, 2) int64, merged


def owner(rank: int, gpus, ranges, comm_spans=()) -> Owner:
    epochs = merged([(r.start, r.end) for r in ranges if EPOCH.match(r.name)])
    batches = sorted((r for r in ranges if BATCH.match(r.name)), key=lambda r: r.start)
    starts = np.array([b.start for b in batches], dtype=np.int64)
    ends = np.array([b.end for b in batches], dtype=np.int64)
    phases = []
    for r in ranges:
        if r.name in PHASES and len(starts):
            i = int(np.searchsorted(starts, r.start, side="right")) - 1
            if i >= 0 and r.end <= ends[i]:
                phases.append((r.start, r.end, PHASES.index(r.name)))
    cuts, labels = segments(phases)
    return Owner(rank, tuple(sorted({g for g in gpus if g is not None})), epochs, cuts, labels, merged(comm_spans))


def merged(spans) -> np.ndarray:
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def segments(ranges) -> tuple[np.ndarray, np.ndarray]:
    """(start, end, label) ranges -> elementary segment starts and each one's label: that of the
    range holding it that started last; -1 where none does."""
    events = sorted(ranges)
    bounds = sorted({t for a, b, _ in events for t in (a, b)})
    active: list[tuple[int, int, int]] = []
    labels, i = [], 0
    for b in bounds:
        while i < len(events) and events[i][0] <= b:
            heapq.heappush(active, (-events[i][0], events[i][1], events[i][2]))
            i += 1
        while active and active[0][1] <= b:
            heapq.heappop(active)
        labels.append(active[0][2] if active else -1)
    return np.array(bounds, dtype=np.int64), np.array(labels, dtype=np.int64)


def inside(spans: np.ndarray, t: np.ndarray) -> np.ndarray:
    if not len(spans):
        return np.zeros(len(t), dtype=bool)
    at = np.searchsorted(spans[:, 0], t, side="right") - 1
    return (at >= 0) & (t < spans[np.maximum(at, 0), 1])


class Sums:
    """Counts, sums and histograms per (rank, GPU, metric, region), filled chunk by chunk."""

    def __init__(self, source: MetricsSource, owners: list[Owner], window: tuple[int, int] | None = None):
        self.window, self.kept = window, []  # the values inside the window, as they are (the lab's figure)
        self.derived_bw = {s.gpu for s in source.series if s.key.startswith(("dram_read", "dram_write"))} - \
            {s.gpu for s in source.series if s.key.startswith("dram_bw")}
        units = {s.key.rsplit("_", 1)[1] for s in source.series if s.key.startswith("dram_read")} or {"pct"}
        derived = {f"dram_bw_{u}" for u in units} if self.derived_bw else set()
        self.owners = owners
        self.keys = tuple(k for k in KEYS if k in set(source.keys()) | derived)
        self.key_of = np.full(len(KEYS), -1, dtype=np.int64)
        for k, key in enumerate(self.keys):
            self.key_of[KEYS.index(key)] = k
        self.rate = np.array([key.endswith("_mbps") for key in self.keys])
        self.pairs = [(o, g) for o in range(len(owners)) for g in owners[o].gpus]
        top = max([g for _, g in self.pairs] + list(source.gpus) + [0]) + 1
        self.pair_of = np.full((len(owners), top + 1), -1, dtype=np.int64)
        for p, (o, g) in enumerate(self.pairs):
            self.pair_of[o, g] = p
        cells = len(self.pairs) * len(self.keys) * len(REGIONS)
        self.count, self.total = np.zeros(cells, dtype=np.int64), np.zeros(cells)
        self.hist = np.zeros(cells * BINS, dtype=np.int64)
        self.hist_sum = np.zeros(cells * BINS)  # a bin's value is the mean of the values in it
        self.tx_busy, self.both_busy = np.zeros(len(self.pairs), dtype=np.int64), np.zeros(len(self.pairs), dtype=np.int64)
        self.busy_unit: dict[int, str] = {}
        self.values = self.placed = self.unused_gpu = self.outside = 0
        self.unknown = source.unknown
        self.top = top
        self.joint = Joint(source)

    def add(self, chunk: Chunk) -> None:
        self.unknown += chunk.unknown
        self.values += len(chunk.time)
        if self.window is not None:
            keep = (chunk.time >= self.window[0]) & (chunk.time < self.window[1])
            if keep.any():
                self.kept.append(Chunk(chunk.time[keep], chunk.gpu[keep], chunk.key[keep], chunk.value[keep]))
        gpu = np.clip(chunk.gpu, 0, self.top)
        t = chunk.time
        # Rows of one instant lie together: each run of equal times is placed once, then spread.
        starts = np.flatnonzero(np.concatenate([[True], t[1:] != t[:-1]])) if len(t) else np.empty(0, dtype=np.int64)
        lengths = np.diff(np.concatenate([starts, [len(t)]]))
        owned, placed = np.zeros(len(gpu), dtype=bool), np.zeros(len(gpu), dtype=bool)
        for o, own in enumerate(self.owners):
            pair = self.pair_of[o, gpu]
            mine = pair >= 0
            owned |= mine
            region, comm = (np.repeat(x, lengths) for x in self._regions(own, t[starts]))
            here = mine & (region >= 0)
            placed |= here
            self._sum(pair[here], self.key_of[chunk.key[here]], region[here], comm[here], chunk.value[here])
        self.placed += int(placed.sum())
        self.unused_gpu += int((~owned).sum())
        self.outside += int((owned & ~placed).sum())
        for joint_t, joint_g, wide in (self.joint.feed(chunk) if chunk.wide is None else [chunk.wide]):
            self._derived(joint_t, joint_g, wide)

    def _regions(self, own: Owner, time) -> tuple[np.ndarray, np.ndarray]:
        """Per time: its region's index in REGIONS (a phase or `other`; -1 outside the epochs), and
        whether it lies inside one of the rank's NCCL kernels."""
        region = np.full(len(time), OTHER, dtype=np.int64)
        if len(own.cuts):
            at = np.searchsorted(own.cuts, time, side="right") - 1
            label = own.labels[np.maximum(at, 0)]
            region = np.where((at >= 0) & (label >= 0), label + 1, OTHER)
        region = np.where(inside(own.epochs, time), region, -1)
        return region, inside(own.comm, time)

    def finish(self) -> None:
        for t, g, wide in self.joint.rest():
            self._derived(t, g, wide)

    def _derived(self, t, g, wide: dict) -> None:
        """DRAM read + write as dram_bw for GPUs that sample no bandwidth of their own; PCIe busy together."""
        gpu = np.clip(g, 0, self.top)
        bw_key = next((f"dram_bw_{u}" for u in ("pct", "mbps") if f"dram_bw_{u}" in self.keys), None)
        for o, own in enumerate(self.owners):
            pair = self.pair_of[o, gpu]
            region, comm = self._regions(own, t)
            here = (pair >= 0) & (region >= 0)
            if not here.any():
                continue
            read, write = wide.get("dram_read"), wide.get("dram_write")
            needs = here & np.isin(gpu, list(self.derived_bw))
            if bw_key and (read is not None or write is not None) and needs.any():
                parts = np.vstack([x[needs] for x in (read, write) if x is not None])
                ok = ~np.all(np.isnan(parts), axis=0)
                both = np.nansum(parts, axis=0)[ok]
                self._sum(pair[needs][ok], np.full(len(both), self.keys.index(bw_key)), region[needs][ok],
                          comm[needs][ok], both)
            tx, rx = wide.get("pcie_tx"), wide.get("pcie_rx")
            if tx is not None and rx is not None:
                unit = self.joint.unit["pcie_tx"]
                sel = here & ~np.isnan(tx) & ~np.isnan(rx)
                busy = sel & (tx >= BUSY[unit])
                self.tx_busy += np.bincount(pair[busy], minlength=len(self.pairs))
                self.both_busy += np.bincount(pair[busy & (rx >= BUSY[unit])], minlength=len(self.pairs))
                for p in np.unique(pair[sel]).tolist():
                    self.busy_unit[p] = unit

    def _sum(self, pair, key, region, comm, value) -> None:
        """Each value into its (pair, key, region) cell, and into the pair's `comm` cell where comm."""
        if not len(pair):
            return
        base = (pair * len(self.keys) + key) * len(REGIONS)
        cell, b, v = base + region, self._bins(key, value), value
        if comm.any():
            cell, b, v = np.concatenate([cell, base[comm] + COMM]), np.concatenate([b, b[comm]]), \
                np.concatenate([v, v[comm]])
        size = len(self.count)
        self.count += np.bincount(cell, minlength=size)
        self.total += np.bincount(cell, weights=v, minlength=size)
        at = cell * BINS + b
        self.hist += np.bincount(at, minlength=size * BINS)
        self.hist_sum += np.bincount(at, weights=v, minlength=size * BINS)

    def _bins(self, key, value) -> np.ndarray:
        bins = np.clip(np.rint(value * 10), 0, BINS - 1).astype(np.int64)
        rate = self.rate[key]
        if rate.any():
            logged = np.rint(np.log(np.maximum(value[rate], RATE_LOW) / RATE_LOW) / RATE_STEP)
            bins[rate] = np.clip(logged, 0, BINS - 1).astype(np.int64)
        return bins

    def stat(self, pair: int, key: str, region: str) -> dict | None:
        """{mean, p95, samples} of one cell; `epochs` is every region but `comm` together."""
        first = (pair * len(self.keys) + self.keys.index(key)) * len(REGIONS)
        cells = range(first + 1, first + COMM) if region == "epochs" else [first + REGIONS.index(region)]
        n = int(sum(int(self.count[c]) for c in cells))
        if not n:
            return None
        hist = sum(self.hist[c * BINS:(c + 1) * BINS] for c in cells)
        sums = sum(self.hist_sum[c * BINS:(c + 1) * BINS] for c in cells)
        total = sum(float(self.total[c]) for c in cells)
        return {"mean": total / n, "p95": p95(np.asarray(hist), np.asarray(sums), n), "samples": n}


def p95(hist: np.ndarray, sums: np.ndarray, n: int) -> float:
    """numpy's linear-interpolated 95th percentile of the n values the histogram holds, each order
    statistic read as the mean of its bin's values (exact where a bin holds one distinct value)."""
    h = 0.95 * (n - 1)
    low = int(np.floor(h))
    at = np.searchsorted(np.cumsum(hist), [low, min(low + 1, n - 1)], side="right")
    values = sums[at] / np.maximum(hist[at], 1)
    return float(values[0] + (h - low) * (values[1] - values[0]))


def place(source: MetricsSource, owners: list[Owner], window: tuple[int, int] | None = None) -> Sums:
    sums = Sums(source, owners, window)
    for chunk in chunks(source):
        sums.add(chunk)
    sums.finish()
    return sums
