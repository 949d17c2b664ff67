"""The CPU time a training epoch took on the host's cores, the loader's apart from the rank's own
(the epoch's `cpu_time` in the metrics JSON, docs/METRICS.md); the what-if shares the cores
between them (handler/profiling/scaling/cores.py).

- loader: the rank's DataLoader worker processes: those joined inside the epoch (RUSAGE_CHILDREN:
  the only children a rank forks while it trains), and those still alive at its end (children
  named `pt_data_worker`, read from /proc); and DALI's CPU threads (the rank's threads named
  `[DALI]...`).
- rank: the rank process's CPU time (every thread: compute, launches, Python) less the DALI
  threads counted above.
A DALI thread that ended inside the epoch is not read apart: its time stays in the rank's. Linux's /proc counts in clock ticks (10 ms), so an epoch of a few
steps reads coarsely; without /proc the loader reads 0 and `from` says so.
"""
import os
import resource
import time
from pathlib import Path

import torch

from ..runtime import dist

DATA_WORKER = "pt_data_worker"  # the name PyTorch's DataLoader gives its worker processes
DALI_THREAD = "[DALI]"  # DALI names its threads [DALI][TPk], [DALI][WT], ...
PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(path: Path) -> tuple[int, float] | None:
    """(parent pid, CPU seconds: user + system) of /proc/.../stat, None when it is gone."""
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _name(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def workers() -> dict[int, float]:
    """pid -> CPU seconds of this process's DataLoader workers alive now."""
    me, out = os.getpid(), {}
    for entry in PROC.glob("[0-9]*"):
        stat = _stat(entry / "stat")
        if stat and stat[0] == me and _name(entry / "comm") == DATA_WORKER:
            out[int(entry.name)] = stat[1]
    return out


def dali_threads() -> dict[int, float]:
    """tid -> CPU seconds of this process's DALI threads alive now."""
    out = {}
    for entry in (PROC / "self" / "task").glob("[0-9]*"):
        if _name(entry / "comm").startswith(DALI_THREAD) and (stat := _stat(entry / "stat")):
            out[int(entry.name)] = stat[1]
    return out


def _joined() -> float:
    """CPU seconds of this process's children that have ended and been joined (the DataLoader's
    workers: the only children a rank forks while it trains)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _grown(before: dict, after: dict) -> float:
    """CPU seconds the ones alive at the end spent since the start (0 for each born since)."""
    return sum(max(0.0, cpu - before.get(key, 0.0)) for key, cpu in after.items())


class CpuClock:
    """Started before an epoch, read after it: `cpu_time(steps, device)`."""

    def __init__(self):
        self.start = (time.process_time(), _joined(), workers(), dali_threads())

    def read(self) -> tuple[float, float, float]:
        """(rank's own s, DataLoader workers' s, DALI threads' s) since the start, this rank."""
        process, reaped, forked, dali = self.start
        dali_s = _grown(dali, dali_threads())
        joined = _joined() - reaped
        return max(0.0, time.process_time() - process - dali_s), joined + _grown(forked, workers()), dali_s

    def cpu_time(self, steps: int, device) -> dict | None:
        """The epoch's `cpu_time`: per step, the mean over the ranks (one all-reduce, every rank calls it)."""
        rank_s, forked_s, dali_s = self.read()
        sums = torch.tensor([rank_s, forked_s, dali_s, 1.0], dtype=torch.float64).to(device)
        dist.all_reduce_sum(sums)
        rank_s, forked_s, dali_s, ranks = sums.tolist()
        if steps <= 0:
            return None
        per = 1e3 / (steps * ranks)
        return {"rank_ms_per_step": rank_s * per, "loader_ms_per_step": (forked_s + dali_s) * per,
                "workers_ms_per_step": forked_s * per, "dali_ms_per_step": dali_s * per, "steps": steps,
                "ranks": int(ranks), "from": FROM if PROC.is_dir() else "process_time alone (no /proc: loader not read)"}


FROM = ("this run: time.process_time of each rank less its `[DALI]` threads (/proc/self/task), its "
        f"`{DATA_WORKER}` processes (RUSAGE_CHILDREN, /proc/<pid>/stat); per step, the mean over the ranks")
