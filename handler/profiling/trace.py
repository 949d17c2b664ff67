"""What the analysis needs from an nsys SQLite export: NVTX ranges per process, GPU activity.

Only the documented export tables are read (NVTX_EVENTS, StringIds, CUPTI_ACTIVITY_KIND_*);
they have kept these columns across nsys releases. A process is identified by the pid
packed into nsys' serialized global ids.
"""
import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from handler.common.errors import UserError

RANK_MARK = re.compile(r"rank (\d+)")
EPOCH = re.compile(r"epoch (\d+)")
KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
TRANSFERS = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


@dataclass(frozen=True)
class Range:
    name: str
    start: int  # ns
    end: int

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
    """A kernel, copy or memset on the GPU; `name` is None except for kernels."""
    pid: int
    device: int
    start: int
    end: int
    name: str | None


@dataclass(frozen=True)
class Trace:
    processes: tuple[Process, ...]  # sorted by rank
    rank_source: str  # "nvtx mark" or "pid order"
    gpu: tuple[GpuActivity, ...] | None  # None: no CUDA activity recorded (CPU-only run)


def _pid(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def load_trace(path: Path) -> Trace:
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "NVTX_EVENTS" not in tables:
                raise UserError(f"{path} has no NVTX ranges; profile with --trace including nvtx "
                                "(scripts/launch.sh does) and let the run reach its training loop")
            events = db.execute(
                "SELECT e.start, e.end, COALESCE(e.text, s.value), e.globalTid FROM NVTX_EVENTS e "
                "LEFT JOIN StringIds s ON s.id = e.textId ORDER BY e.start").fetchall()
            gpu = _gpu_activity(db, tables) or None  # empty tables: a non-lazy export of a CPU run
    except sqlite3.DatabaseError as err:
        raise UserError(f"{path} is not an nsys SQLite export ({err}); pass the .nsys-rep instead")
    processes, source = _processes(events)
    if not processes:
        raise UserError(f"{path} has no 'epoch N' NVTX ranges or 'rank N' marks; profile a "
                        "training run of train_cifar.py (scripts/launch.sh does)")
    return Trace(processes, source, gpu)


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
            ranges.setdefault(pid, []).append(Range(text, start, end))
    trainers = set(marks) | {pid for pid, rs in ranges.items() if any(EPOCH.fullmatch(r.name) for r in rs)}
    by_mark = all(pid in marks for pid in trainers) and len(set(marks.values())) == len(marks)
    rank_of = marks if by_mark else {pid: r for r, pid in enumerate(sorted(trainers))}
    processes = sorted((Process(pid, rank_of[pid], tuple(ranges.get(pid, ()))) for pid in trainers),
                       key=lambda p: p.rank)
    return tuple(processes), "nvtx mark" if by_mark else "pid order"


def _gpu_activity(db, tables) -> tuple[GpuActivity, ...]:
    rows = []
    if KERNELS in tables:
        rows += db.execute(f"SELECT k.globalPid, k.deviceId, k.start, k.end, COALESCE(s.value, '') "
                           f"FROM {KERNELS} k LEFT JOIN StringIds s ON s.id = k.shortName").fetchall()
    for table in TRANSFERS:
        if table in tables:
            rows += db.execute(f"SELECT globalPid, deviceId, start, end, NULL FROM {table}").fetchall()
    return tuple(GpuActivity(_pid(gpid), dev, start, end, name) for gpid, dev, start, end, name in rows)
