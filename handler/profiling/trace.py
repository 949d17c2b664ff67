"""What the analysis needs from an nsys SQLite export: NVTX ranges per process, GPU activity.

Only the documented export tables are read (NVTX_EVENTS, StringIds, CUPTI_ACTIVITY_KIND_*,
GPU_METRICS, ThreadNames, TARGET_INFO_CUDA_DEVICE); tables and columns an older export lacks
are skipped, never guessed. Every query orders by start: nsys 2025.6 stopped writing rows in
time order. A process is identified by the pid packed into nsys' serialized global ids.
"""
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from handler.runtime.errors import UserError
from handler.runtime.names import EPOCH, HOST, RANK

from .columns import GpuColumns, load_gpu
from .gpu_metrics import MetricSample, load_metric_samples

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
    host: str | None = None  # from its 'host NAME' mark; None in profiles without one


@dataclass(frozen=True)
class Trace:
    processes: tuple[Process, ...]  # sorted by rank
    rank_source: str  # "nvtx mark" or "pid order"
    gpu: GpuColumns | None  # None: no CUDA activity recorded (CPU-only run)
    metrics: tuple[MetricSample, ...] | None = None  # None: no GPU metrics sampled
    thread_names: dict = field(default_factory=dict)  # globalTid -> its names (ThreadNames)
    cuda_devices: dict | None = None  # (pid, CUDA ordinal) -> nsys GPU id; None: no TARGET_INFO_CUDA_DEVICE


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
            gpu = load_gpu(db, tables, columns)  # None for empty tables: a non-lazy export of a CPU run
            metrics = load_metric_samples(db, tables) or None
            names, devices = _thread_names(db, tables), _cuda_devices(db, tables)
    except sqlite3.DatabaseError as err:
        raise UserError(f"{path} is not an nsys SQLite export ({err}); pass the .nsys-rep instead")
    processes, source = _processes(events)
    if not processes:
        raise UserError(f"{path} has no 'epoch N' NVTX ranges or 'rank N' marks; profile a "
                        "training run of train_cifar.py (scripts/launch.sh does)")
    return Trace(processes, source, gpu, metrics, names, devices)


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
    ranges, marks, hosts = {}, {}, {}
    for start, end, text, tid in events:
        pid = _pid(tid)
        if end is None:  # a mark
            found = RANK.match(text or "")
            if found:
                marks[pid] = int(found.group(1))
            found = HOST.match(text or "")
            if found:
                hosts[pid] = found.group(1)
        elif text:
            ranges.setdefault(pid, []).append(Range(text, start, end, tid))
    trainers = set(marks) | {pid for pid, rs in ranges.items() if any(EPOCH.match(r.name) for r in rs)}
    by_mark = all(pid in marks for pid in trainers) and len(set(marks.values())) == len(marks)
    rank_of = marks if by_mark else {pid: r for r, pid in enumerate(sorted(trainers))}
    processes = sorted((Process(pid, rank_of[pid], tuple(ranges.get(pid, ())), hosts.get(pid)) for pid in trainers),
                       key=lambda p: p.rank)
    return tuple(processes), "nvtx mark" if by_mark else "pid order"


def _thread_names(db, tables) -> dict:
    """globalTid -> the names nsys recorded for that thread (a thread renamed later has several)."""
    if not {"ThreadNames", "StringIds"} <= tables or not {"nameId", "globalTid"} <= columns(db, "ThreadNames"):
        return {}
    names = {}
    for tid, name in db.execute("SELECT t.globalTid, s.value FROM ThreadNames t "
                                "JOIN StringIds s ON s.id = t.nameId ORDER BY t.rowid"):
        names[tid] = names.get(tid, ()) + (name,)
    return names


def _cuda_devices(db, tables) -> dict | None:
    """(pid, CUDA ordinal) -> nsys GPU id, from TARGET_INFO_CUDA_DEVICE(gpuId, cudaId, pid).

    The ordinal is what CUPTI's deviceId holds (the process's view, after CUDA_VISIBLE_DEVICES);
    the GPU id is what GPU metrics are keyed by. None: the export has no such table (nsys 2022.2)."""
    if "TARGET_INFO_CUDA_DEVICE" not in tables:
        return None
    if not {"gpuId", "cudaId", "pid"} <= columns(db, "TARGET_INFO_CUDA_DEVICE"):
        return None
    return {(pid if pid < 1 << 24 else _pid(pid), cuda): gpu for gpu, cuda, pid in
            db.execute("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE") if pid is not None}
