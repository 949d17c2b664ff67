"""The machine a report ran on, read from the report and the run's metrics JSON, never assumed:
the summary's `machine` block (docs/PROFILING.md, "What-if"), each fact with where it came from.

- cpu_cores: nsys' TARGET_INFO_SYSTEM_ENV row `CpuCores` (the host the report was recorded on);
  else the metrics' env.cpu_cores (the cores the rank could run on), else env.cpu_count.
- loader_workers: per training process. The metrics' config.workers where given (what the run
  asked for); else read from the report: DALI's CPU threads are its `[DALI][TPk]` pool threads,
  counted in a rank's process; PyTorch's DataLoader workers are processes whose thread is named
  `pt_data_worker`. A DataLoader starts them anew for every pass (each epoch, validation, test)
  and the export keeps no process lifetimes, so they are read as bursts: the workers of one pass
  are forked together, their PIDs within a few of each other, and the ranks start each pass
  together (DDP keeps them in step). Every burst the same size, a multiple of the ranks, gives
  workers = size / ranks; where the report names its passes (our `validate` and `test` ranges
  beside the epochs), the bursts must also number the passes. Anything else: None, saying so.
  0 means the loader runs in the rank.
- rank_cores: the cores the ranks could run on (the metrics' env.cpu_cores: rank 0's CPU affinity,
  which a container, taskset or Slurm's cgroup narrows below the host's cpu_cores); readers use it
  where recorded, else cpu_cores. A report alone does not record a process's affinity.
- threads_per_rank: the metrics' env.torch_threads (each rank sets the same count).
- loader_cpu_ms, rank_cpu_ms: CPU time per step and rank of the loader and of the rank's own
  threads, from the metrics' epochs[].cpu_time (cores.py), else from the report's scheduling
  events (sched.py), else None.
A fact nothing gave is None, and its `_from` says so.
"""
from typing import Any
import re
from pathlib import Path

from handler.runtime.names import EPOCH, TEST, VALIDATE

from ..nsys import open_export
from .sched import cpu_time_for

DATA_WORKER = "pt_data_worker"
BURST_GAP = 6  # PIDs further apart were not forked in one burst (seen: 1-3 within a burst, 11 and more between)
DALI_POOL = re.compile(r"\[DALI\]\[TP(\d+)\]")
UNKNOWN = "not recorded"


def machine_of(export: Path | None, ranks: list[dict[str, Any]], metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """ranks: the summary's ranks (their pids). export: the report's SQLite export, or None."""
    env, config = (metrics or {}).get("env") or {}, (metrics or {}).get("config") or {}
    system, threads = _read(export)
    cores, cores_from = (system, "nsys TARGET_INFO_SYSTEM_ENV CpuCores") if system else \
        (env.get("cpu_cores"), "metrics env.cpu_cores") if env.get("cpu_cores") else \
        (env.get("cpu_count"), "metrics env.cpu_count") if env.get("cpu_count") else (None, UNKNOWN)
    if config.get("workers") is not None:
        workers, workers_from = float(config["workers"]), "metrics config.workers"
    else:
        workers, workers_from = _workers(export, threads, [r.get("pid") for r in ranks])
    rank_cores = env.get("cpu_cores") if isinstance(env.get("cpu_cores"), int) and env["cpu_cores"] >= 1 else None
    return {"cpu_cores": cores, "cpu_cores_from": cores_from, "rank_cores": rank_cores,
            "rank_cores_from": "metrics env.cpu_cores: the ranks' CPU affinity" if rank_cores else
            UNKNOWN + ": the run's metrics JSON records the ranks' CPU affinity as env.cpu_cores",
            "loader_workers": workers,
            "loader_workers_from": workers_from, "threads_per_rank": env.get("torch_threads"),
            "threads_per_rank_from": "metrics env.torch_threads" if env.get("torch_threads") else UNKNOWN,
            **cpu_time_for(export, ranks, metrics)}


def _read(export: Path | None) -> tuple[int | None, dict | None]:
    """(CpuCores or None, {pid: [thread names]} or None without a ThreadNames table)."""
    if export is None:
        return None, None
    with open_export(export) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        cores = None
        if "TARGET_INFO_SYSTEM_ENV" in tables:
            row = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CpuCores'").fetchone()
            cores = int(row[0]) if row and str(row[0]).isdigit() else None
        threads = None
        if {"ThreadNames", "StringIds"} <= tables:
            threads = {}
            for tid, name in db.execute("SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s "
                                        "ON s.id = t.nameId"):
                threads.setdefault((tid >> 24) & 0xFFFFFF, []).append(name)
    return cores, threads


def _passes(export: Path, pids: list) -> int | None:
    """DataLoader passes per rank where the report names them all (our validate/test ranges beside
    the epochs) and every rank made as many; else None. Read only for a report with DataLoader workers."""
    counts = {}
    with open_export(export) as db:
        for text, tid in db.execute("SELECT COALESCE(n.text, s.value), n.globalTid FROM NVTX_EVENTS n "
                                    "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.end IS NOT NULL"):
            kind = 0 if text and EPOCH.match(text) else 1 if text in (VALIDATE, TEST) else None
            if kind is not None:
                counts.setdefault((tid >> 24) & 0xFFFFFF, [0, 0])[kind] += 1
    per_rank = {tuple(counts.get(pid, (0, 0))) for pid in pids}
    if len(per_rank) != 1:
        return None
    epochs, evaluations = per_rank.pop()
    return epochs + evaluations if epochs and evaluations else None


def _workers(export: Path | None, threads: dict | None, pids: list) -> tuple[float | None, str]:
    if export is None or threads is None:
        return None, UNKNOWN + " (the report has no thread names)"
    forked = sorted(pid for pid, names in threads.items() if DATA_WORKER in names)
    if forked:
        return _dataloader_workers(forked, len(pids), _passes(export, pids))
    pools = [len({m.group(1) for n in threads.get(pid, ()) if (m := DALI_POOL.match(n))}) for pid in pids]
    if any(pools):
        return max(pools), "report: DALI's `[DALI][TPk]` threads in a rank"
    return 0.0, "report: no DataLoader worker process or DALI thread, so the loader runs in the rank"


def _dataloader_workers(forked: list[int], ranks: int, passes: int | None) -> tuple[float | None, str]:
    """forked: the worker processes' PIDs, sorted. See the module's docstring."""
    bursts = [[forked[0]]]
    for pid in forked[1:]:
        if pid - bursts[-1][-1] > BURST_GAP:
            bursts.append([])
        bursts[-1].append(pid)
    sizes = sorted({len(b) for b in bursts})
    held = (f"the report holds {len(forked)} `{DATA_WORKER}` processes over {ranks} rank{'s' * (ranks != 1)}, "
            f"started in {len(bursts)} bursts")
    if len(sizes) == 1 and ranks and sizes[0] % ranks == 0 and passes in (None, len(bursts)):
        counted = f"{passes} passes named in the report" if passes else "one per pass, the ranks in step"
        return sizes[0] / ranks, f"report: {held} of {sizes[0]} ({counted})"
    why = (f"of {', '.join(map(str, sizes))}" if len(sizes) > 1 or sizes[0] % max(ranks, 1) else
           f"where the report names {passes} passes per rank")
    return None, (f"not read: {held} {why}, so how many each loader ran at once cannot be told (a DataLoader starts "
                  "its workers anew for every pass); the run's metrics JSON beside the report gives config.workers")
