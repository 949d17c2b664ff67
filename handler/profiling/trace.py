"""What the analysis needs from an nsys SQLite export: NVTX ranges per process, GPU activity.

Only the documented export tables are read (NVTX_EVENTS, StringIds, CUPTI_ACTIVITY_KIND_*,
GPU_METRICS); tables and columns an older export lacks are skipped, never guessed. Every
query orders by start: nsys 2025.6 stopped writing rows in time order. A process is
identified by the pid packed into nsys' serialized global ids.
"""
import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from handler.runtime.errors import UserError

from .gpu_metrics import MetricSample, load_metric_samples

RANK_MARK = re.compile(r"rank (\d+)")
EPOCH = re.compile(r"epoch (\d+)")
KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
TRANSFERS = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"


@dataclass(frozen=True)
class Range:
    name: str
    start: int  # ns
    end: int
    tid: int = 0  # serialized global thread id of the thread that opened it

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9


@dataclass(frozen=True)
class Process:
    """One training rank: its pid, its rank and every NVTX range it pushed."""
    pid: int
    rank: int
    ranges: tuple[Range, ...]


@dataclass(frozen=True)
class GpuActivity:
    """A kernel, copy or memset on the GPU; `name` is None except for kernels.

    `tid` and `launched` are the launching CUDA runtime call's thread and start, linked
    through correlationId; None when the export has no runtime row for it."""
    pid: int
    device: int
    start: int
    end: int
    name: str | None
    tid: int | None = None
    launched: int | None = None


@dataclass(frozen=True)
class Trace:
    processes: tuple[Process, ...]  # sorted by rank
    rank_source: str  # "nvtx mark" or "pid order"
    gpu: tuple[GpuActivity, ...] | None  # None: no CUDA activity recorded (CPU-only run)
    metrics: tuple[MetricSample, ...] | None = None  # None: no GPU metrics sampled


def _pid(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def load_trace(path: Path) -> Trace:
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "NVTX_EVENTS" not in tables:
                raise UserError(f"{path} has no NVTX ranges; profile with --trace including nvtx "
                                "(scripts/launch.sh does) and let the run reach its training loop")
            events = db.execute(_nvtx_query(db, tables)).fetchall()
            gpu = _gpu_activity(db, tables) or None  # empty tables: a non-lazy export of a CPU run
            metrics = load_metric_samples(db, tables) or None
    except sqlite3.DatabaseError as err:
        raise UserError(f"{path} is not an nsys SQLite export ({err}); pass the .nsys-rep instead")
    processes, source = _processes(events)
    if not processes:
        raise UserError(f"{path} has no 'epoch N' NVTX ranges or 'rank N' marks; profile a "
                        "training run of train_cifar.py (scripts/launch.sh does)")
    return Trace(processes, source, gpu, metrics)


def columns(db, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _nvtx_query(db, tables) -> str:
    """Text is inline (`text`) or, for registered strings, in StringIds via `textId`."""
    have = columns(db, "NVTX_EVENTS")
    text = "e.text" if "text" in have else "NULL"
    if "textId" in have and "StringIds" in tables:
        return (f"SELECT e.start, e.end, COALESCE({text}, s.value), e.globalTid FROM NVTX_EVENTS e "
                "LEFT JOIN StringIds s ON s.id = e.textId ORDER BY e.start")
    return f"SELECT e.start, e.end, {text}, e.globalTid FROM NVTX_EVENTS e ORDER BY e.start"


def _processes(events) -> tuple[tuple[Process, ...], str]:
    """Group ranges by process; ranks come from 'rank N' marks, else from pid order."""
    ranges, marks = {}, {}
    for start, end, text, tid in events:
        pid = _pid(tid)
        if end is None:  # a mark
            found = RANK_MARK.fullmatch(text or "")
            if found:
                marks[pid] = int(found.group(1))
        elif text:
            ranges.setdefault(pid, []).append(Range(text, start, end, tid))
    trainers = set(marks) | {pid for pid, rs in ranges.items() if any(EPOCH.fullmatch(r.name) for r in rs)}
    by_mark = all(pid in marks for pid in trainers) and len(set(marks.values())) == len(marks)
    rank_of = marks if by_mark else {pid: r for r, pid in enumerate(sorted(trainers))}
    processes = sorted((Process(pid, rank_of[pid], tuple(ranges.get(pid, ()))) for pid in trainers),
                       key=lambda p: p.rank)
    return tuple(processes), "nvtx mark" if by_mark else "pid order"


def _gpu_activity(db, tables) -> tuple[GpuActivity, ...]:
    rows = []
    for table in (KERNELS, *TRANSFERS):
        if table not in tables:
            continue
        have = columns(db, table)
        corr = "a.correlationId" if "correlationId" in have else "NULL"
        if table == KERNELS and "StringIds" in tables:
            rows += db.execute(f"SELECT a.globalPid, a.deviceId, a.start, a.end, COALESCE(s.value, ''), {corr} "
                               f"FROM {table} a LEFT JOIN StringIds s ON s.id = a.shortName "
                               "ORDER BY a.start").fetchall()
        else:
            name = "''" if table == KERNELS else "NULL"
            rows += db.execute(f"SELECT a.globalPid, a.deviceId, a.start, a.end, {name}, {corr} "
                               f"FROM {table} a ORDER BY a.start").fetchall()
    launches = _launches(db, tables)
    activity = []
    for gpid, dev, start, end, name, corr in rows:
        pid = _pid(gpid)
        tid, launched = launches.get((pid, corr), (None, None))
        activity.append(GpuActivity(pid, dev, start, end, name, tid, launched))
    return tuple(sorted(activity, key=lambda a: a.start))


def _launches(db, tables) -> dict:
    """(pid, correlationId) -> (thread, start) of the CUDA runtime call; ids repeat across processes."""
    if RUNTIME not in tables or not {"correlationId", "globalTid"} <= columns(db, RUNTIME):
        return {}
    found = {}
    for start, tid, corr in db.execute(f"SELECT start, globalTid, correlationId FROM {RUNTIME} ORDER BY start"):
        found.setdefault((_pid(tid), corr), (tid, start))
    return found
