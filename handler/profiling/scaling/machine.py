# pyright: strict
"""The machine a report ran on, read from the report and the run's metrics JSON, never assumed:
the summary's `machine` block (docs/PROFILING.md, "What-if"), each fact with where it came from.

- cpu_cores: nsys' TARGET_INFO_SYSTEM_ENV row `CpuCores` (the host the report was recorded on);
  else the metrics' env.cpu_cores (the cores the rank could run on), else env.cpu_count. A value
  that is no count of cores (not a whole number from 1 to 1e6: `1e26`, `-4`, `many`) is read as not
  recorded, and `cpu_cores_from` says what it read.
- loader_workers: per training process. The metrics' config.workers where given (what the run
  asked for); else read from the report: DALI's CPU threads are its `[DALI][TPk]` pool threads,
  counted in a rank's process; PyTorch's DataLoader workers are processes (workers.py: a thread
  named `pt_data_worker`, or unnamed, read from the process tree). A DataLoader starts them anew
  for every pass (each epoch, validation, test) and the export keeps no process lifetimes, so they
  are read as bursts: the workers of one pass are forked together, their PIDs within a few of each
  other, and the ranks start each pass together (DDP keeps them in step). Every burst the same
  size, a multiple of the ranks, gives workers = size / ranks; where the report names its passes
  (the epochs and the `validate` and `test` ranges, as the convention that read it names them),
  the bursts must also number the passes. Anything else: None, saying so. 0 means the loader runs
  in the rank.
- rank_cores: the cores the ranks could run on (the metrics' env.cpu_cores: rank 0's CPU affinity,
  which a container, taskset or Slurm's cgroup narrows below the host's cpu_cores); readers use it
  where recorded, else cpu_cores. A report alone does not record a process's affinity.
- threads_per_rank: the metrics' env.torch_threads (each rank sets the same count).
- loader_cpu_ms, rank_cpu_ms: CPU time per step and rank of the loader and of the rank's own
  threads, from the metrics' epochs[].cpu_time (cores.py), else from the report's scheduling
  events (sched.py), else None; sched_events and sched_line count what those events held.
A fact nothing gave is None, and its `_from` says so.
"""
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handler.runtime.names import EPOCH, TEST, VALIDATE

from ..nsys import open_export
from ..trace import Process
from .sched import cpu_time_for, epoch_windows
from .workers import LoaderProcesses, loader_processes

BURST_GAP = 6  # PIDs further apart were not forked in one burst (seen: 1-3 within a burst, 11 and more between)
DALI_POOL = re.compile(r"\[DALI\]\[TP(\d+)\]")
UNKNOWN = "not recorded"
MOST_CORES = 1_000_000  # docs/summary.schema.json's bound: more is no machine's count
CORES_ROW = "nsys TARGET_INFO_SYSTEM_ENV CpuCores"


@dataclass(frozen=True)
class ExportFacts:
    cores: int | None = None
    cores_said: str | None = None  # why the export's CpuCores was not taken, where it holds one
    threads: dict[int, tuple[str, ...]] | None = None  # globalTid -> names; None: no ThreadNames table
    loaders: LoaderProcesses = field(default_factory=lambda: LoaderProcesses((), ()))

    def by_pid(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for tid, names in (self.threads or {}).items():
            out.setdefault((tid >> 24) & 0xFFFFFF, []).extend(names)
        return out


def machine_of(export: Path | None, ranks: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any] | None = None,
               processes: Iterable[Process] = ()) -> dict[str, Any]:
    """ranks: the summary's ranks (their pids and steps); processes: the trace's, whose epochs (of the
    convention that read the report) place the scheduling events. export: the SQLite export, or None."""
    env: Mapping[str, Any] = (metrics or {}).get("env") or {}
    config: Mapping[str, Any] = (metrics or {}).get("config") or {}
    processes = tuple(processes)
    windows = epoch_windows(processes)
    pids = [int(r["pid"]) for r in ranks if r.get("pid") is not None]
    facts = _read(export, pids, (windows[0][0], windows[-1][1]) if windows else None)
    cores, cores_from = _cores(facts, env)
    if config.get("workers") is not None:
        workers, workers_from = float(config["workers"]), "metrics config.workers"
    else:
        workers, workers_from = _workers(export, facts, pids, _passes(processes, pids))
    rank_cores = _count(env.get("cpu_cores"))
    return {"cpu_cores": cores, "cpu_cores_from": cores_from, "rank_cores": rank_cores,
            "rank_cores_from": "metrics env.cpu_cores: the ranks' CPU affinity" if rank_cores else
            UNKNOWN + ": the run's metrics JSON records the ranks' CPU affinity as env.cpu_cores",
            "loader_workers": workers,
            "loader_workers_from": workers_from, "threads_per_rank": env.get("torch_threads"),
            "threads_per_rank_from": "metrics env.torch_threads" if env.get("torch_threads") else UNKNOWN,
            **cpu_time_for(export, ranks, metrics, windows, facts.loaders, facts.threads or {})}


def _count(value: object) -> int | None:
    """A count of cores, or None for anything that is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 1 <= value <= MOST_CORES else None
    if isinstance(value, str) and value.strip().isdigit():
        return _count(int(value))
    return None


def _cores(facts: ExportFacts, env: Mapping[str, Any]) -> tuple[int | None, str]:
    said = f" ({facts.cores_said})" if facts.cores_said else ""
    if facts.cores is not None:
        return facts.cores, CORES_ROW
    for key in ("cpu_cores", "cpu_count"):
        if (found := _count(env.get(key))) is not None:
            return found, f"metrics env.{key}{said}"
        if env.get(key) is not None:
            said += f" (metrics env.{key} {env.get(key)!r} is no count of cores)"
    return None, UNKNOWN + said


def _read(export: Path | None, pids: Sequence[int], window: tuple[int, int] | None) -> ExportFacts:
    if export is None:
        return ExportFacts()
    with open_export(export) as db:
        tables = {str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        cores, said = None, None
        if "TARGET_INFO_SYSTEM_ENV" in tables:
            row = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CpuCores'").fetchone()
            if row is not None:
                cores = _count(str(row[0]))
                said = None if cores else (f"{CORES_ROW} reads {str(row[0])[:40]!r}, no count of cores: not a "
                                           f"whole number from 1 to {MOST_CORES:,}")
        threads: dict[int, tuple[str, ...]] | None = None
        if {"ThreadNames", "StringIds"} <= tables:
            threads = {}
            for tid, name in db.execute("SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s "
                                        "ON s.id = t.nameId WHERE t.globalTid IS NOT NULL ORDER BY t.rowid"):
                threads[int(tid)] = threads.get(int(tid), ()) + (str(name),)
        by_pid = ExportFacts(threads=threads).by_pid()
        loaders = loader_processes(db, tables, pids, window, by_pid)
    return ExportFacts(cores, said, threads, loaders)


def _passes(processes: Sequence[Process], pids: Sequence[int]) -> int | None:
    """DataLoader passes per rank where the report names them all (epochs, with validate/test ranges
    beside them, by the names of the convention that read it) and every rank made as many; else None."""
    counts: dict[int, list[int]] = {}
    for process in processes:
        own = counts.setdefault(process.pid, [0, 0])
        for r in process.ranges:
            kind = 0 if EPOCH.pattern.fullmatch(r.name) else 1 if r.name in (VALIDATE, TEST) else None
            if kind is not None:
                own[kind] += 1
    per_rank = {tuple(counts.get(pid, (0, 0))) for pid in pids}
    if len(per_rank) != 1:
        return None
    epochs, evaluations = per_rank.pop()
    return epochs + evaluations if epochs and evaluations else None


def _workers(export: Path | None, facts: ExportFacts, pids: Sequence[int],
             passes: int | None) -> tuple[float | None, str]:
    if export is None or facts.threads is None:
        return None, UNKNOWN + " (the report has no thread names)"
    if forked := list(facts.loaders.pids):
        return _dataloader_workers(forked, len(pids), passes, facts.loaders.says())
    threads = facts.by_pid()
    pools = [len({m.group(1) for n in threads.get(pid, ()) if (m := DALI_POOL.match(n))}) for pid in pids]
    if any(pools):
        return max(pools), "report: DALI's `[DALI][TPk]` threads in a rank"
    return 0.0, "report: no DataLoader worker process or DALI thread, so the loader runs in the rank"


def _dataloader_workers(forked: list[int], ranks: int, passes: int | None, what: str) -> tuple[float | None, str]:
    """forked: the worker processes' PIDs, sorted. See the module's docstring."""
    bursts = [[forked[0]]]
    for pid in forked[1:]:
        if pid - bursts[-1][-1] > BURST_GAP:
            bursts.append([])
        bursts[-1].append(pid)
    sizes = sorted({len(b) for b in bursts})
    held = (f"the report holds {len(forked)} {what} over {ranks} rank{'s' * (ranks != 1)}, "
            f"started in {len(bursts)} bursts")
    if len(sizes) == 1 and ranks and sizes[0] % ranks == 0 and passes in (None, len(bursts)):
        counted = f"{passes} passes named in the report" if passes else "one per pass, the ranks in step"
        return sizes[0] / ranks, f"report: {held} of {sizes[0]} ({counted})"
    why = (f"of {', '.join(map(str, sizes))}" if len(sizes) > 1 or sizes[0] % max(ranks, 1) else
           f"where the report names {passes} passes per rank")
    return None, (f"not read: {held} {why}, so how many each loader ran at once cannot be told (a DataLoader starts "
                  "its workers anew for every pass); the run's metrics JSON beside the report gives config.workers")


def machine_line(machine: Mapping[str, Any] | None) -> str | None:
    """The page's line on the machine: cores, loader workers, CPU time, and the scheduling events' count."""
    if not machine:
        return None
    cpu = (f"loader {machine['loader_cpu_ms']:.1f} ms and rank {machine['rank_cpu_ms']:.1f} ms of CPU a step"
           if machine.get("loader_cpu_ms") is not None and machine.get("rank_cpu_ms") is not None else "CPU time")
    workers = machine.get("loader_workers")
    return (f"Machine: {machine.get('cpu_cores') or '?'} CPU cores ({machine.get('cpu_cores_from')}); "
            f"{'?' if workers is None else f'{workers:g}'} loader workers per process "
            f"({machine.get('loader_workers_from')}); {cpu} ({machine.get('cpu_time_from')})"
            + (f"; {machine['sched_line']}" if machine.get("sched_line") else "") + ".")
