"""A report's CPU time by thread, from what nsys recorded of the scheduler (`SCHED_EVENTS`: each
thread scheduled in and out of a core, recorded with `--cpuctxsw=process-tree`, the default
where nsys samples the CPU, as the course kit's `nsys profile --trace=...` does): the
`machine` block's loader_cpu_ms and rank_cpu_ms for a report whose run wrote no `cpu_time`
(cores.py). Only the time inside the ranks' closed `epoch N` ranges counts, as in the metrics.

- loader: DALI's threads in a rank (named `[DALI]...`) and the DataLoader's worker processes
  (a process with a thread named `pt_data_worker`);
- rank: every other thread of a rank's process.
Per step and rank: the sums over the ranks' steps of their closed epochs.
"""
import sqlite3
from contextlib import closing
from pathlib import Path

from handler.runtime.names import EPOCH

from ..record.metrics import Metrics
from .cores import cpu_time_of

DATA_WORKER, DALI_THREAD = "pt_data_worker", "[DALI]"


def _pid(tid: int) -> int:
    return (tid >> 24) & 0xFFFFFF


def report_cpu_time(export: Path | None, ranks: list[dict]) -> dict | None:
    """{loader_cpu_ms, rank_cpu_ms, cpu_time_from}, or None where the report holds no scheduling events."""
    if export is None:
        return None
    pids = {r.get("pid") for r in ranks}
    steps = sum(((r.get("loop") or {}).get("steps") or 0) for r in ranks)
    with closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"SCHED_EVENTS", "NVTX_EVENTS", "ThreadNames", "StringIds"} <= tables or not steps:
            return None
        windows = _merged([(start, end) for start, end, text, tid in db.execute(
            "SELECT n.start, n.end, COALESCE(n.text, s.value), n.globalTid FROM NVTX_EVENTS n "
            "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.end IS NOT NULL")
            if text and EPOCH.match(text) and _pid(tid) in pids])
        names = dict(db.execute("SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"))
        workers = {_pid(tid) for tid, name in names.items() if name == DATA_WORKER}
        spent = {"loader": 0, "rank": 0}
        running: dict = {}
        for start, into, tid in db.execute("SELECT start, isSchedIn, globalTid FROM SCHED_EVENTS ORDER BY start"):
            part = _part(tid, names.get(tid, ""), pids, workers)
            if part is None:
                continue
            if into:
                running[tid] = start
            elif tid in running:
                spent[part] += _inside(running.pop(tid), start, windows)
    if not windows:
        return None
    return {"loader_cpu_ms": spent["loader"] / 1e6 / steps, "rank_cpu_ms": spent["rank"] / 1e6 / steps,
            "cpu_time_from": "report: nsys SCHED_EVENTS inside the ranks' epoch ranges (DALI threads and "
                             f"`{DATA_WORKER}` processes the loader's), per step of {steps} over the ranks"}


def _part(tid: int, name: str, pids: set, workers: set) -> str | None:
    pid = _pid(tid)
    if pid in pids:
        return "loader" if name.startswith(DALI_THREAD) else "rank"
    return "loader" if pid in workers else None


def _merged(spans: list) -> list:
    out: list = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def _inside(start: int, end: int, windows: list) -> int:
    """Nanoseconds of [start, end) inside the windows."""
    return sum(max(0, min(end, b) - max(start, a)) for a, b in windows if a < end and start < b)


def cpu_time_for(export: Path | None, ranks: list[dict], metrics: dict | None) -> dict:
    """The machine block's CPU time: the run's metrics where it recorded them, else the report's
    scheduling events, else `not recorded` (cores.py says on the page what is then assumed)."""
    recorded = cpu_time_of(Metrics.model_validate(metrics) if metrics else None)  # validated at its read (record/)
    if recorded["loader_cpu_ms"] is not None:
        return recorded
    return report_cpu_time(export, ranks) or {**recorded, "cpu_time_from": recorded["cpu_time_from"] + (
        " and no nsys scheduling events in the report" if export is not None else "")}
