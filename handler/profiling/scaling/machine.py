"""The machine a report ran on, read from the report and the run's metrics JSON, never assumed:
the summary's `machine` block (docs/PROFILING.md, "What-if"), each fact with where it came from.

- cpu_cores: nsys' TARGET_INFO_SYSTEM_ENV row `CpuCores` (the host the report was recorded on);
  else the metrics' env.cpu_cores (the cores the rank could run on), else env.cpu_count.
- loader_workers: per training process. The metrics' config.workers where given (what the run
  asked for); else read from the report: DALI's CPU threads are its `[DALI][TPk]` pool threads,
  counted in a rank's process; PyTorch's DataLoader workers are processes whose thread is named
  `pt_data_worker`, but a DataLoader starts them anew for every pass (each epoch, validation) and
  the export keeps no process lifetimes, so their count over a capture is not the count per
  loader: None, saying so. 0 means the loader runs in the rank.
- threads_per_rank: the metrics' env.torch_threads (each rank sets the same count).
A fact nothing gave is None, and its `_from` says so.
"""
import re
import sqlite3
from contextlib import closing
from pathlib import Path

DATA_WORKER = "pt_data_worker"
DALI_POOL = re.compile(r"\[DALI\]\[TP(\d+)\]")
UNKNOWN = "not recorded"


def machine_of(export: Path | None, ranks: list[dict], metrics: dict | None = None) -> dict:
    """ranks: the summary's ranks (their pids). export: the report's SQLite export, or None."""
    env, config = (metrics or {}).get("env") or {}, (metrics or {}).get("config") or {}
    system, threads = _read(export)
    cores, cores_from = (system, "nsys TARGET_INFO_SYSTEM_ENV CpuCores") if system else \
        (env.get("cpu_cores"), "metrics env.cpu_cores") if env.get("cpu_cores") else \
        (env.get("cpu_count"), "metrics env.cpu_count") if env.get("cpu_count") else (None, UNKNOWN)
    if config.get("workers") is not None:
        workers, workers_from = float(config["workers"]), "metrics config.workers"
    else:
        workers, workers_from = _workers(threads, [r.get("pid") for r in ranks])
    return {"cpu_cores": cores, "cpu_cores_from": cores_from, "loader_workers": workers,
            "loader_workers_from": workers_from, "threads_per_rank": env.get("torch_threads"),
            "threads_per_rank_from": "metrics env.torch_threads" if env.get("torch_threads") else UNKNOWN}


def _read(export: Path | None) -> tuple[int | None, dict | None]:
    """(CpuCores or None, {pid: [thread names]} or None without a ThreadNames table)."""
    if export is None:
        return None, None
    with closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
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


def _workers(threads: dict | None, pids: list) -> tuple[float | None, str]:
    if threads is None:
        return None, UNKNOWN + " (the report has no thread names)"
    loaders = sum(1 for names in threads.values() if DATA_WORKER in names)
    if loaders:  # a DataLoader starts its workers anew for each pass (every epoch, and validation's too)
        return None, (f"not read: the report holds {loaders} `{DATA_WORKER}` processes over {len(pids)} ranks, but a "
                      "DataLoader starts its workers anew for every pass, so how many ran at once cannot be told; the "
                      "run's metrics JSON beside the report gives config.workers")
    pools = [len({m.group(1) for n in threads.get(pid, ()) if (m := DALI_POOL.match(n))}) for pid in pids]
    if any(pools):
        return max(pools), "report: DALI's `[DALI][TPk]` threads in a rank"
    return 0.0, "report: no DataLoader worker process or DALI thread, so the loader runs in the rank"
