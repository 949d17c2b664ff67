"""What the analysis needs from an nsys SQLite export: NVTX ranges per process, GPU activity.

Only the documented export tables are read (NVTX_EVENTS, StringIds, CUPTI_ACTIVITY_KIND_*,
GPU_METRICS, ThreadNames, TARGET_INFO_CUDA_DEVICE); tables and columns an older export lacks
are skipped, never guessed. Every query orders by start: nsys 2025.6 stopped writing rows in
time order. A process is identified by the pid packed into nsys' serialized global ids.

A run killed inside an epoch (OOM, an NCCL abort) leaves that epoch's range open: nsys writes it
with no end, or (2022.4, seen in its exports) closes it at the capture's end, ANALYSIS_DETAILS'
`duration`. Such a process keeps the epochs before it and is marked `cut_short` (_cut_short).
"""
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import count
from pathlib import Path

from handler.runtime.errors import UserError
from handler.runtime.names import BATCH, EPOCH, HOST, RANK

from .columns import KERNELS, RUNTIME, TRANSFERS, GpuColumns, load_gpu
from .conventions import OURS, Convention, detect, library_of
from .devices import Copies, load_copies, load_peaks
from .gpu_metrics import MetricsSource, find_source, unread
from .nsys import damaged, export_problem, not_an_export, open_export

@dataclass(frozen=True, slots=True)  # one per NVTX range: 70 k of them in a 30-epoch run
class Range:
    name: str
    start: int  # ns
    end: int
    tid: int = 0  # serialized global thread id of the thread that opened it
    domain: str | None = None  # the name of its NVTX domain (DALI, NCCL, ...); None: the default or an unnamed one
    closed: bool = True  # False: nsys recorded no end (the process died inside it); end is then start

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9


@dataclass(frozen=True)
class CutShort:
    """Where a rank's run ended: inside `epoch`, its first epoch range left open."""
    epoch: int
    range: str  # that range's name as the report has it
    complete_epochs: int  # the epochs before it, which still count
    dropped_steps: int  # the steps of the open epoch, left out with it


@dataclass(frozen=True)
class Process:
    """One training rank: its pid, its rank and every NVTX range it pushed."""
    pid: int
    rank: int
    ranges: tuple[Range, ...]
    host: str | None = None  # from its 'host NAME' mark; None in profiles without one
    cut_short: CutShort | None = None  # the run ended inside a range (its ranges from there on are left out)


@dataclass(frozen=True)
class Trace:
    processes: tuple[Process, ...]  # sorted by rank
    rank_source: str  # "nvtx mark" or "pid order"
    gpu: GpuColumns | None  # None: no CUDA activity recorded (CPU-only run)
    metrics: MetricsSource | None = None  # None: no GPU metrics sampled (gpu_metrics.py; read per use)
    thread_names: dict = field(default_factory=dict)  # globalTid -> its names (ThreadNames)
    cuda_devices: dict | None = None  # (pid, CUDA ordinal) -> nsys GPU id; None: no TARGET_INFO_CUDA_DEVICE
    convention: str = OURS.name  # the naming convention its ranges were read by (conventions.py)
    copies: Copies | None = None  # memcpy rows with their kind and bytes; None: none recorded
    memory_peaks: dict | None = None  # CUDA device -> peak bytes (--cuda-memory-usage); None: not recorded
    hostname: str | None = None  # TARGET_INFO_SYSTEM_ENV `Hostname`: the host nsys recorded on; None: not exported
    metrics_unread: str | None = None  # why GPU-metric rows the export holds were not read (gpu_metrics.unread)


def _pid(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def load_trace(path: Path, convention: Convention | None = None) -> Trace:
    """convention: how the ranges are named; None: detected (conventions.detect)."""
    if problem := export_problem(path):
        raise UserError(problem)
    with open_export(path) as db:  # a damaged page anywhere: one line naming the file
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "NVTX_EVENTS" not in tables:  # damage first: what is there may be unreadable, not absent
            _check(db, path, tables)
            raise UserError(not_an_export(path, tables) or f"{path} has no NVTX ranges; profile with --trace "
                            "including nvtx (scripts/launch.sh does) and let the run reach its training loop")
        events = _named_domains(db.execute(_nvtx_query(db, tables)).fetchall())
        capture_end = _capture_end(db, tables)
        gpu = load_gpu(db, tables, columns, path)  # None for empty tables: a non-lazy export of a CPU run
        metrics = find_source(path, db, tables)
        names, devices = _thread_names(db, tables), _cuda_devices(db, tables)
        copies, peaks = load_copies(db, tables, columns, path), load_peaks(db, tables, columns, path)
        hostname = _hostname(db, tables)
        metrics_unread = unread(db, tables) if metrics is None else None
        _check(db, path, tables - {*WALKED, *([metrics.layout] if metrics is not None else [])})
    processes, source, given = (), "", convention
    if convention is None:  # ours first, exactly as before; another convention only where ours finds nothing
        processes, source = _processes(events)
        convention = OURS if processes else detect(e[2] for e in events if e[2])
    if convention is not OURS:
        processes, source = _other_processes(events, convention, gpu)
    elif not processes:
        processes, source = _processes(events)
    if not processes and given is not None:  # the user's own mapping (--ranges) named nothing here
        seen = Counter(re.sub(r"\d+", "*", e[2]) for e in events
                       if e[2] and e[1] is not None and not library_of(e[2], e[4])).most_common(6)
        raise UserError(f"{path}: the --ranges mapping ({given.name}) names no step in its NVTX ranges; match "
                        "the patterns to its names (the most frequent, numbers as *: "
                        f"{', '.join(repr(n) for n, _ in seen) or 'none'})")
    if not processes:
        raise UserError(f"{path} has no 'epoch N' NVTX ranges or 'rank N' marks, nor epochs or steps named as "
                        "the lab kit ('Epoch N' > 'Batch N') or torch.profiler ('ProfilerStep#N') name them; "
                        "name yours with --ranges epoch='Epoch *' step='Batch *' (docs/PROFILING.md)")
    processes = tuple(_cut_short(p, capture_end) for p in processes)
    return Trace(processes, source, gpu, metrics, names, devices, (convention or OURS).name, copies, peaks, hostname, metrics_unread)


WALKED = (KERNELS, *TRANSFERS, RUNTIME, "NVTX_EVENTS")  # read row by row in load_trace: a damaged page fails the read


def _check(db, path: Path, tables: set[str]) -> None:
    """SQLite's quick_check of these tables: load_trace passes those its reads do not walk (a damaged
    page in one the report never reads is named too). The walked ones, most of a real export's pages,
    fail their own read on a damaged page (open_export, sql_columns.read_arrow), so checking them
    again would double the reads' work (nsys stats checks nothing)."""
    for table in sorted(tables):
        found = db.execute(f'PRAGMA quick_check("{table}")').fetchone()[0]
        if found != "ok":
            raise UserError(damaged(path, found))


def columns(db, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


NVTX_DOMAIN_CREATE = 75  # ENUM_NSYS_EVENT_TYPE: NvtxDomainCreate, its text the domain's name
# ENUM_NSYS_EVENT_TYPE's ranges: NvtxPushRange, NvtxStartRange, NvtxPushPopRange, NvtxStartEndRange
NVTX_RANGES = (35, 37, 59, 60)


def _nvtx_query(db, tables) -> str:
    """Text is inline (`text`) or, for registered strings, in StringIds via `textId`; with it
    each event's eventType and domainId, where the export has them (for _named_domains)."""
    have = columns(db, "NVTX_EVENTS")
    text = "e.text" if "text" in have else "NULL"
    extra = ", ".join(f"e.{c}" if c in have else "NULL" for c in ("eventType", "domainId"))
    if "textId" in have and "StringIds" in tables:
        return (f"SELECT e.start, e.end, COALESCE({text}, s.value), e.globalTid, {extra} FROM NVTX_EVENTS e "
                "LEFT JOIN StringIds s ON s.id = e.textId ORDER BY e.start")
    return f"SELECT e.start, e.end, {text}, e.globalTid, {extra} FROM NVTX_EVENTS e ORDER BY e.start"


def _named_domains(rows) -> list[tuple]:
    """(start, end, text, globalTid, domain name or None, closed) per event: a domain is named by its
    NvtxDomainCreate event in the same process; the default domain (0) and unnamed ones get None.
    A range that nsys wrote without a valid end is not closed; its end is its start."""
    names = {(_pid(tid), domain): text for _, _, text, tid, kind, domain in rows
             if kind == NVTX_DOMAIN_CREATE and domain and text}
    out = []
    for start, end, text, tid, kind, domain in rows:
        closed = kind not in NVTX_RANGES or (end is not None and end >= start)
        out.append((start, end if closed else start, text, tid, names.get((_pid(tid), domain)) if domain else None,
                    closed))
    return out


def _capture_end(db, tables) -> int | None:
    """The capture's end on the events' clock (ANALYSIS_DETAILS.duration); None where not exported."""
    if "ANALYSIS_DETAILS" not in tables or "duration" not in columns(db, "ANALYSIS_DETAILS"):
        return None
    row = db.execute("SELECT MAX(duration) FROM ANALYSIS_DETAILS").fetchone()
    return row[0] if row and isinstance(row[0], int) else None


def _cut_short(process: Process, capture_end: int | None) -> Process:
    """The process with the ranges from its first open epoch on left out, and where it ended.
    An epoch is open when it has no end or ends exactly at the capture's end, where nsys puts
    the end it never saw (a finished loop closes its epochs before it exits). Another range
    without an end (a library's thread stopped at exit, say) is left out alone: it cannot be
    timed, and the epochs around it are whole."""
    def open_epoch(r: Range) -> bool:
        return bool(EPOCH.match(r.name)) and (not r.closed or r.end == capture_end)

    epochs = sorted((r for r in process.ranges if open_epoch(r)), key=lambda r: r.start)
    if not epochs:
        closed = tuple(r for r in process.ranges if r.closed)
        return process if len(closed) == len(process.ranges) else replace(process, ranges=closed)
    first = epochs[0]
    kept = tuple(r for r in process.ranges if r.closed and r.start < first.start)
    found = EPOCH.match(first.name)
    assert found, "epochs holds only epoch ranges"
    steps = sum(1 for r in process.ranges if BATCH.match(r.name)) - sum(1 for r in kept if BATCH.match(r.name))
    return replace(process, ranges=kept, cut_short=CutShort(
        int(found.group(1)), first.name, sum(1 for r in kept if EPOCH.match(r.name)), steps))


def _processes(events) -> tuple[tuple[Process, ...], str]:
    """Group ranges by process; ranks come from 'rank N' marks, else from pid order."""
    ranges, marks, hosts = {}, {}, {}
    for start, end, text, tid, domain, closed in events:
        pid = _pid(tid)
        if end is None:  # a mark
            found = RANK.match(text or "")
            if found:
                marks[pid] = int(found.group(1))
            found = HOST.match(text or "")
            if found:
                hosts[pid] = found.group(1)
        elif text:
            ranges.setdefault(pid, []).append(Range(text, start, end, tid, domain, closed))
    trainers = set(marks) | {pid for pid, rs in ranges.items() if any(EPOCH.match(r.name) for r in rs)}
    by_mark = all(pid in marks for pid in trainers) and len(set(marks.values())) == len(marks)
    rank_of = marks if by_mark else {pid: r for r, pid in enumerate(sorted(trainers))}
    processes = sorted((Process(pid, rank_of[pid], tuple(ranges.get(pid, ())), hosts.get(pid)) for pid in trainers),
                       key=lambda p: p.rank)
    return tuple(processes), "nvtx mark" if by_mark else "pid order"


def _other_processes(events, convention: Convention | None, gpu) -> tuple[tuple[Process, ...], str]:
    """Ranges renamed to ours by the convention; without `rank N` marks the ranks are the
    processes that launched kernels or, in a CPU-only profile, that opened epochs (or steps,
    for a convention without epochs), in pid order."""
    if convention is None:
        return (), ""
    ranges, marks = {}, {}
    for start, end, text, tid, domain, closed in events:
        pid = _pid(tid)
        if end is None:
            if found := RANK.match(text or ""):
                marks[pid] = int(found.group(1))
        elif text:
            ranges.setdefault(pid, []).append(Range(convention.canonical(text) or _unnamed(text), start, end, tid,
                                                    domain, closed))
    if convention.epoch is not None and not convention.epoch.groups:  # `--ranges epoch='Train'`: numbered in order
        for pid, own in ranges.items():
            number = count()
            ranges[pid] = [replace(r, name=EPOCH(next(number))) if r.name == EPOCH(0) else r
                           for r in sorted(own, key=lambda r: r.start)]
    if convention.epoch is None:  # steps only: each process's steps are epoch 0
        for own in ranges.values():
            steps = [r for r in own if BATCH.match(r.name) and r.closed]
            if steps:
                own.append(Range(EPOCH(0), min(r.start for r in steps), max(r.end for r in steps), steps[0].tid))
                own.sort(key=lambda r: r.start)
    launched = set(gpu.pid[gpu.is_kernel()].tolist()) if gpu is not None else set()
    opened = {pid for pid, own in ranges.items() if any(EPOCH.match(r.name) for r in own)}
    trainers, source = ((launched & opened) or launched, "processes that launched kernels") if launched else \
        (opened, "processes that opened epochs")
    if trainers and all(pid in marks for pid in trainers) and len({marks[p] for p in trainers}) == len(trainers):
        rank_of, source = {pid: marks[pid] for pid in trainers}, "nvtx mark"
    else:
        rank_of = {pid: r for r, pid in enumerate(sorted(trainers))}
        source += ", in pid order"
    return tuple(sorted((Process(pid, rank_of[pid], tuple(ranges.get(pid, ()))) for pid in trainers),
                        key=lambda p: p.rank)), source


def _unnamed(text: str) -> str:
    """A range the convention does not name. One that bears our epoch or step name (a report of
    ours read with --ranges) is kept apart, so it neither doubles the convention's epochs and steps
    nor clashes with the epoch 0 of a convention without epochs."""
    return f"({text})" if EPOCH.match(text) or BATCH.match(text) else text


def _hostname(db, tables) -> str | None:
    """The host nsys recorded the report on (TARGET_INFO_SYSTEM_ENV `Hostname`); None where not exported."""
    if "TARGET_INFO_SYSTEM_ENV" not in tables or not {"name", "value"} <= columns(db, "TARGET_INFO_SYSTEM_ENV"):
        return None
    row = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()
    return (str(row[0]).strip() or None) if row and row[0] is not None else None


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
