"""GPU metrics needed side by side at one instant: DRAM read and write (their sum, dram_bw), PCIe TX and RX
(the PCIe overlap). docs/PROFILING.md, "GPU metrics"."""
import numpy as np

from . import JOINT, KEYS, MetricsSource
from .read import Chunk


class Joint:
    """DRAM read and write, PCIe TX and RX, side by side per (GPU, instant). GPU_METRICS writes each in
    a row of its own, so an instant split between two chunks waits for the next (bounded: one instant
    per GPU at a chunk's edge)."""

    def __init__(self, source: MetricsSource):
        self.index = {j: {KEYS.index(f"{j}_{u}") for u in ("pct", "mbps")} for j in JOINT}
        self.unit = {j: next((s.key.rsplit("_", 1)[1] for s in source.series if s.key.startswith(j)), "pct")
                     for j in JOINT}
        per_gpu: dict[int, set] = {}
        for s in source.series:
            if s.key.rsplit("_", 1)[0] in JOINT:
                per_gpu.setdefault(s.gpu, set()).add(s.key.rsplit("_", 1)[0])
        self.expected = np.zeros(max(list(per_gpu) + [0]) + 2, dtype=np.int64)
        for g, names in per_gpu.items():
            self.expected[g] = len(names)
        self.wanted = np.array(sorted(i for ids in self.index.values() for i in ids), dtype=np.int64)
        self.carry: tuple | None = None

    def feed(self, chunk: Chunk):
        pick = np.isin(chunk.key, self.wanted)
        rows = (chunk.time[pick], chunk.gpu[pick], chunk.key[pick], chunk.value[pick])
        if self.carry is not None:
            rows = tuple(np.concatenate([a, b]) for a, b in zip(self.carry, rows))
            self.carry = None
        if not len(rows[0]):
            return
        out, self.carry = self._pivot(rows, keep_partial=False)
        if out is not None:
            yield out

    def rest(self):
        if self.carry is not None and len(self.carry[0]):
            out, _ = self._pivot(self.carry, keep_partial=True)
            self.carry = None
            if out is not None:
                yield out

    def _pivot(self, rows, keep_partial: bool):
        t, g, k, v = rows
        pair = np.maximum(t, -(1 << 54)) * 256 + g  # the GPU is one byte; times stay far below 2^54 ns
        if len(pair) > 1 and not bool(np.all(pair[1:] >= pair[:-1])):
            order = np.argsort(pair, kind="stable")
            t, g, k, v = t[order], g[order], k[order], v[order]
        new = np.ones(len(t), dtype=bool)
        new[1:] = (t[1:] != t[:-1]) | (g[1:] != g[:-1])
        group = np.cumsum(new) - 1
        count = int(group[-1]) + 1
        wide, present = {}, np.zeros(count, dtype=np.int64)
        for name, ids in self.index.items():
            mask = np.isin(k, list(ids))
            if mask.any():
                column = np.full(count, np.nan)
                column[group[mask]] = v[mask]
                wide[name] = column
                present += ~np.isnan(column)
        firsts = np.flatnonzero(new)
        gt, gg = t[firsts], g[firsts]
        done = keep_partial | (present >= self.expected[np.clip(gg, 0, len(self.expected) - 1)])
        carry = None
        if not done.all():
            late = ~done[group]
            carry = (t[late], g[late], k[late], v[late])
        if not done.any():
            return None, carry
        return (gt[done], gg[done], {n: c[done] for n, c in wide.items()}), carry
