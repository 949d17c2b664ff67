"""The host's cores as one resource shared by the ranks and their loaders (docs/PROFILING.md, "What-if").

What a run's CPU time was spent on comes from its metrics JSON (`cpu_time` of each epoch,
handler/data/cpu_time.py): per step and rank, the loader's (DataLoader workers, DALI's CPU
threads) and the rank's own (its compute, launches and Python); for a report from elsewhere,
from nsys' scheduler events (sched.py). The summary's `machine` block carries them
(machine.py: loader_cpu_ms, rank_cpu_ms, cpu_time_from).

A CPU run of n ranks on C cores, t = the threads a rank computes with (the harness gives each
rank its share of the cores: t * n stays the report's t0 * n0):
- compute: the same work (the global batch stays) spread over min(n * t, C) threads.
- the loaders: their CPU time per step stays (the same images) and lands on the ranks' cores.
  A rank's threads meet at every operator, so a loader holding one of its cores stalls the
  whole rank: a rank of t threads loses t / C of the loaders' time, n ranks of t = C / n
  threads lose 1 / n of it each. Cores no rank uses (n * t < C) take the loaders first.
- the wait for data and the all-reduce as before (scale.py).
At the report's own count that is the measured step: the compute is what remains of the
measured one once the loaders' stall is taken out.

A GPU run's loaders: each rank's main thread launches and needs a core of its own, so the
loaders' workers get the cores the ranks leave (C - n), at most a core per worker, and never
fewer than at fewer ranks; a loader without workers runs in the rank's thread (a core per rank).
"""
import math
from statistics import median
from typing import Any

from ..record.metrics import Metrics
from ..record.summary import Machine
from .step import Split

UNKNOWN = "not recorded"


def cpu_time_of(metrics: Metrics | None) -> dict[str, Any]:
    """machine.loader_cpu_ms, rank_cpu_ms, cpu_time_from: the median over the epochs after the first
    (the first's one-off costs left out), the one where there is only one."""
    epochs = [e.cpu_time for e in (metrics.epochs if metrics else ()) if e.cpu_time is not None]
    used = epochs[1:] or epochs
    if not used:
        return {"loader_cpu_ms": None, "rank_cpu_ms": None, "cpu_time_from": UNKNOWN + " (no `cpu_time` in the "
                "run's metrics JSON: a run from elsewhere, or one older than it)"}
    return {"loader_cpu_ms": median(e.loader_ms_per_step for e in used),
            "rank_cpu_ms": median(e.rank_ms_per_step for e in used),
            "cpu_time_from": f"metrics epochs[].cpu_time, the median of {len(used)} epoch{'s' * (len(used) != 1)}"
                             f"{' after the first' if len(epochs) > 1 else ''}"}


def cores_of(machine: Machine) -> int | None:
    """The cores the ranks may use: rank_cores where recorded, else the host's."""
    return machine.rank_cores or machine.cpu_cores


def gpu_loader_cores(processes: int, machine: Machine) -> float:
    """The cores n ranks' loaders run on (see the module's docstring). Without the host's cores
    every loader gets its own."""
    workers = machine.loader_workers
    cores = cores_of(machine)
    if workers is not None and workers < 1:  # the loader is the rank's own thread
        return min(float(processes), cores) if cores else float(processes)
    per = workers if workers is not None else 1.0
    if not cores:
        return processes * per
    # never fewer than at fewer ranks: the loaders' wait stops shrinking past the host's cores. The most
    # over m <= processes of min(m * per, cores - m), a concave function, is where its two lines cross.
    cross = cores / (per + 1)
    near = {1, processes, *(min(processes, max(1, m)) for m in (math.floor(cross), math.ceil(cross)))}
    return max(1.0, *(min(m * per, cores - m) for m in near))


def threads_at(n: int, own: int, machine: Machine) -> int:
    """A rank's compute threads at n ranks: the report's threads times its ranks, shared. Threads not
    recorded: the harness's own choice, each rank its share of the cores (docs/METRICS.md, env.torch_threads),
    so n ranks compute on the cores the report's did, held (x1.00) as the page says."""
    t0 = machine.threads_per_rank or max(1, (cores_of(machine) or own) // own)
    return max(1, (t0 * own) // n)


def stall(loader_s: float, n: int, threads: int, cores: int, compute_s: float) -> float:
    """Seconds per step a rank loses to the loaders (all ranks' loader CPU seconds per step)."""
    spare = max(0, cores - n * threads) * compute_s
    return max(0.0, loader_s - spare) * min(threads, max(1.0, cores / n)) / cores


def cpu_parts(split: Split, n: int, machine: Machine) -> tuple[float, float] | None:
    """A CPU run's cores term at n ranks as (compute, the loaders' stall), seconds per step, or None
    where the run recorded no CPU time or no cores (the caller then says what it did instead)."""
    cores, loader_ms = cores_of(machine), machine.loader_cpu_ms
    if not cores or loader_ms is None:
        return None
    own = split.processes
    loader_s = loader_ms / 1e3 * own
    t0, t = threads_at(own, own, machine), threads_at(n, own, machine)
    held = stall(loader_s, own, t0, cores, split.busy)
    compute = max(split.busy - held, 0.0) * min(own * t0, cores) / min(n * t, cores)
    return compute, stall(loader_s, n, t, cores, compute)


def cpu_work(split: Split, n: int, machine: Machine, efficiency: float = 1.0) -> float | None:
    """The cores term at n ranks: the compute (times the threads' efficiency at n, `efficiency`)
    plus the loaders' stall; None as cpu_parts."""
    parts = cpu_parts(split, n, machine)
    return None if parts is None else parts[0] * efficiency + parts[1]


def efficiency(others: dict[str, dict[int, tuple[Split, Machine]]], own: int) -> dict[int, float]:
    """count -> how much more (or less) compute per step n ranks of fewer threads took than the
    model's share of the cores gives, measured by other modes' reports of this machine, each with
    its own loaders' stall taken out (1 rank of 2 threads against 2 ranks of 1 thread: intra-op
    threads that meet at every operator cost more than ranks that meet once a step). others: mode
    -> count -> (split, machine block); the median over the modes that recorded CPU time."""
    out: dict[int, float] = {}
    for n in sorted({c for by in others.values() for c in by} - {own}):
        ratios: list[float] = []
        for by in others.values():
            if n not in by or own not in by:
                continue
            parts = cpu_parts(by[own][0], n, by[own][1])
            if parts and parts[0] > 0:
                ratios.append(max(by[n][0].busy - parts[1], 0.0) / parts[0])
        if ratios:
            out[n] = median(ratios)
    return out


def says(machine: Machine) -> str:
    """What the CPU prediction read, for the page."""
    if machine.loader_cpu_ms is None:
        return (f"the loaders' and ranks' CPU time {machine.cpu_time_from or UNKNOWN}: assumed the loader "
                "takes no core from the ranks")
    threads = machine.threads_per_rank
    each = (f"{threads} thread{'s' * (threads != 1)} a rank here" if threads else
            "threads not recorded: assumed each rank's share of the cores, the harness's default")
    return (f"loader {machine.loader_cpu_ms:.0f} ms and rank {machine.rank_cpu_ms or 0:.0f} ms of CPU a "
            f"step per rank ({machine.cpu_time_from}), on {cores_of(machine)} cores: the ranks compute on "
            f"their share of them ({each}), the loaders' "
            "time lands on the same cores and stalls each rank for its share")
