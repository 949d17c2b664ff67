"""What the analysis needs from an nsys SQLite export: NVTX ranges per process, GPU activity.

Only the documented export tables are read (NVTX_EVENTS, StringIds, CUPTI_ACTIVITY_KIND_*,
GPU_METRICS, ThreadNames, TARGET_INFO_CUDA_DEVICE); tables and columns an older export lacks
are skipped, never guessed. Every query orders by start: nsys 2025.6 stopped writing rows in
time order. A process is identified by the pid packed into nsys' serialized global ids.
"""
import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from handler.runtime.errors import UserError

from .gpu_metrics import MetricSample, load_metric_samples

RANK_MARK = re.compile(r"rank (\d+)")
HOST_MARK = re.compile(r"host (\S+)")
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
    host: str | None = None  # from its 'host NAME' mark; None in profiles without one


@dataclass(frozen=True)
class GpuActivity:
    """A kernel, copy or memset on the GPU; `name` is None except for kernels.

    `tid` and `launched` are the launching CUDA runtime call's thread and start, linked
    through correlationId; None when the export has no runtime row for it. `full_name` is
    a kernel's demangled name with its namespaces (`dali::kernels::...`), where exported."""
    pid: int
    device: int
    start: int
    end: int
    name: str | None
    tid: int | None = None
    launched: int | None = None
    full_name: str | None = None


@dataclass(frozen=True)
class Trace:
    processes: tuple[Process, ...]  # sorted by rank
    rank_source: str  # "nvtx mark" or "pid order"
    gpu: tuple[GpuActivity, ...] | None  # None: no CUDA activity recorded (CPU-only run)
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
            gpu = _gpu_activity(db, tables) or None  # empty tables: a non-lazy export of a CPU run
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
            found = RANK_MARK.fullmatch(text or "")
            if found:
                marks[pid] = int(found.group(1))
            found = HOST_MARK.fullmatch(text or "")
            if found:
                hosts[pid] = found.group(1)
        elif text:
            ranges.setdefault(pid, []).append(Range(text, start, end, tid))
    trainers = set(marks) | {pid for pid, rs in ranges.items() if any(EPOCH.fullmatch(r.name) for r in rs)}
    by_mark = all(pid in marks for pid in trainers) and len(set(marks.values())) == len(marks)
    rank_of = marks if by_mark else {pid: r for r, pid in enumerate(sorted(trainers))}
    processes = sorted((Process(pid, rank_of[pid], tuple(ranges.get(pid, ())), hosts.get(pid)) for pid in trainers),
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
            full = "a.demangledName" if "demangledName" in have else "NULL"
            rows += db.execute(f"SELECT a.globalPid, a.deviceId, a.start, a.end, COALESCE(s.value, ''), {corr}, "
                               f"{full} FROM {table} a LEFT JOIN StringIds s ON s.id = a.shortName "
                               "ORDER BY a.start").fetchall()
        else:
            name = "''" if table == KERNELS else "NULL"
            rows += db.execute(f"SELECT a.globalPid, a.deviceId, a.start, a.end, {name}, {corr}, NULL "
                               f"FROM {table} a ORDER BY a.start").fetchall()
    launches = _launches(db, tables)
    full_names = _kernel_full_names(db, tables)
    activity = []
    for gpid, dev, start, end, name, corr, full in rows:
        pid = _pid(gpid)
        tid, launched = launches.get((pid, corr), (None, None))
        activity.append(GpuActivity(pid, dev, start, end, name, tid, launched, full_names.get(full)))
    return tuple(sorted(activity, key=lambda a: a.start))


def _kernel_full_names(db, tables) -> dict:
    """StringIds id -> demangled kernel name, one string object per name (names run to kilobytes)."""
    if not {KERNELS, "StringIds"} <= tables or "demangledName" not in columns(db, KERNELS):
        return {}
    return dict(db.execute(f"SELECT s.id, s.value FROM StringIds s WHERE s.id IN "
                           f"(SELECT DISTINCT demangledName FROM {KERNELS})"))


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


def _launches(db, tables) -> dict:
    """(pid, correlationId) -> (thread, start) of the CUDA runtime call; ids repeat across processes."""
    if RUNTIME not in tables or not {"correlationId", "globalTid"} <= columns(db, RUNTIME):
        return {}
    found = {}
    for start, tid, corr in db.execute(f"SELECT start, globalTid, correlationId FROM {RUNTIME} ORDER BY start"):
        found.setdefault((_pid(tid), corr), (tid, start))
    return found
