"""GPU activity as numpy columns: a 30-epoch capture holds millions of kernels and runtime calls.

One Python object per kernel took 2.3 GB and 44 s for 2.0 M kernels (docs/RESULTS.md,
"Profile analysis at scale"). Rows move as columns (sql_columns.read_columns: connectorx into
Arrow into numpy, in chunks of rowids, so no more than a chunk is ever held twice), about 38
bytes a row; the launching runtime call is joined in numpy (sort and searchsorted) a chunk of
calls at a time, and only its thread and start are kept. Rows are grouped by process and in
start order, so a rank's activity (of_pid) is a view, not a copy, and its unions sort nothing.
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from handler.runtime.cpu_memory import give_back_freed_arrays

from .sql_columns import read_columns

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
TRANSFERS = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NO_NAME = -1  # a copy or memset: it has no name
EMPTY_NAME = -2  # a kernel whose name the export does not give
MISSING = -1  # no runtime call linked, no demangled name
CHUNK = 1 << 17  # rowids per read: the most rows held twice (Arrow's and numpy's) at once
LOW = 0xFFFFFFFF  # the low 32 bits of a key: the correlation id; all set: none
PID = "((COALESCE({}, 0) >> 24) & 16777215)"  # the pid packed in a serialized global id


def pid_of(global_id):
    return (global_id >> 24) & 0xFFFFFF


@dataclass(frozen=True, eq=False)
class GpuColumns:
    """Kernels, copies and memsets, grouped by process (pids ascending; process i's rows are
    at[i]:at[i + 1]), in start order within one (merge_arrays then sorts nothing).

    name: a StringIds id into `names` (NO_NAME for copies and memsets, EMPTY_NAME for ''); thread:
    an index into `threads`, the launching runtime call's global thread id (-1: the last entry,
    MISSING, where no call links); launched: that call's start (MISSING where none links);
    full: an id into `full_names` (demangled kernel names), MISSING where not exported."""
    pids: np.ndarray
    at: np.ndarray
    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray
    thread: np.ndarray
    launched: np.ndarray
    full: np.ndarray
    threads: np.ndarray
    names: dict  # StringIds id -> short kernel name
    full_names: dict  # StringIds id -> demangled kernel name

    def __len__(self) -> int:
        return len(self.start)

    @property
    def pid(self) -> np.ndarray:
        return np.repeat(self.pids, np.diff(self.at))

    @property
    def tid(self) -> np.ndarray:
        return self.threads[self.thread]

    def of_threads(self, tids) -> np.ndarray:
        """Rows launched from one of these global thread ids."""
        codes = np.flatnonzero(np.isin(self.threads[:-1], np.asarray(list(tids), dtype=np.int64)))
        return np.isin(self.thread, codes) if len(codes) else np.zeros(len(self), dtype=bool)

    def rows(self, mask: np.ndarray) -> "GpuColumns":
        kept = np.r_[0, np.cumsum(mask)]
        return GpuColumns(self.pids, kept[self.at], **{f: getattr(self, f)[mask] for f in _ARRAYS},
                          threads=self.threads, names=self.names, full_names=self.full_names)

    def of_pid(self, pid: int) -> "GpuColumns":
        i = int(np.searchsorted(self.pids, pid))
        if i == len(self.pids) or self.pids[i] != pid:
            return self.rows(np.zeros(len(self), dtype=bool))
        lo, hi = int(self.at[i]), int(self.at[i + 1])
        return GpuColumns(self.pids[i:i + 1], np.array([0, hi - lo]), **{f: getattr(self, f)[lo:hi] for f in _ARRAYS},
                          threads=self.threads, names=self.names, full_names=self.full_names)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    @property
    def linked(self) -> np.ndarray:
        return self.launched != MISSING

    def is_kernel(self) -> np.ndarray:
        return self.name != NO_NAME

    def named(self) -> np.ndarray:
        """Kernels with a non-empty name (copies, memsets and unnamed kernels are not)."""
        return self._by_name(lambda n: bool(n))

    def is_nccl(self) -> np.ndarray:
        return self._by_name(lambda n: bool(n) and "nccl" in n.lower())

    def full_matches(self, pattern) -> np.ndarray:
        """Rows whose demangled name the regex finds something in."""
        hits = [i for i, n in self.full_names.items() if n and pattern.search(n)]
        return np.isin(self.full, hits) if hits else np.zeros(len(self), dtype=bool)

    def _by_name(self, test) -> np.ndarray:
        hits = [i for i, n in self.names.items() if test(n)] + ([EMPTY_NAME] if test("") else [])
        return np.isin(self.name, hits) if hits else np.zeros(len(self), dtype=bool)


_ARRAYS = ("device", "start", "end", "name", "thread", "launched", "full")


def from_rows(rows, names=None, full_names=None) -> GpuColumns:
    """Columns from (pid, device, start, end, name or None, tid or None, launched or None) tuples:
    for tests that build activity by hand."""
    names = dict(names or {})
    ids = {n: i for i, n in names.items()}
    rows = sorted(rows, key=lambda r: (r[0], r[2]))
    for name in (r[4] for r in rows):
        if name and name not in ids:
            ids[name] = len(names)
            names[len(names)] = name
    threads = np.array(sorted({r[5] for r in rows if r[5] is not None}) + [MISSING], dtype=np.int64)
    pids = np.array(sorted({r[0] for r in rows}), dtype=np.int64)
    column = lambda values, dtype: np.array(list(values), dtype=dtype)  # noqa: E731
    return GpuColumns(
        pids, np.searchsorted(column((r[0] for r in rows), np.int64), np.r_[pids, np.iinfo(np.int64).max]),
        device=column((r[1] for r in rows), np.int16), start=column((r[2] for r in rows), np.int64),
        end=column((r[3] for r in rows), np.int64),
        name=column((NO_NAME if r[4] is None else ids.get(r[4], EMPTY_NAME) for r in rows), np.int32),
        thread=column((-1 if r[5] is None else int(np.searchsorted(threads[:-1], r[5])) for r in rows), np.int32),
        launched=column((MISSING if r[6] is None else r[6] for r in rows), np.int64),
        full=np.full(len(rows), MISSING, dtype=np.int32), threads=threads, names=names,
        full_names=dict(full_names or {}))


def load_gpu(db, tables: set, columns, export: Path) -> GpuColumns | None:
    """The export's kernels, copies and memsets, linked to their runtime calls; None without any.

    One pass over the activity tables reads each row's process and correlation id (one int64
    key) and the columns the analysis uses; the rows are then put in order one column at a time,
    and the keys find each row's launching call."""
    give_back_freed_arrays()  # the temporary columns leave the process when freed
    parts = [t for t in (KERNELS, *TRANSFERS) if t in tables]
    spans = {t: rowids(db, t) for t in parts}
    most = sum(high - low + 1 for low, high in spans.values())  # rowids: nsys numbers rows 1, 2, ...
    read = {"key": np.empty(most, dtype=np.int64), "start": np.empty(most, dtype=np.int64),
            "end": np.empty(most, dtype=np.int64), "device": np.empty(most, dtype=np.int16),
            "name": np.empty(most, dtype=np.int32), "full": np.empty(most, dtype=np.int32)}
    string_ids = "StringIds" in tables
    n = _fill(export, {t: (_activity_sql(t, columns(db, t), string_ids), spans[t]) for t in parts}, read)
    if not n:
        return None
    if n < most:  # rowids with gaps (rows deleted): no more than the rows read
        read = {name: array[:n].copy() for name, array in read.items()}
    keys = read.pop("key")
    pids, at, place = _grouped(keys, read)
    held = list(_sorted_keys(keys, place))
    del keys, place
    thread, launched, threads = _link(db, tables, columns, export, held)  # frees the keys before its last columns
    return GpuColumns(pids, at, **read, thread=thread, launched=launched, threads=threads,
                      names=_strings(db, tables, read["name"]), full_names=_strings(db, tables, read["full"]))


def _grouped(keys: np.ndarray, read: dict):
    """Rows by process, then start: the processes, their bounds and each read row's place (int32,
    read row -> its row); read's columns are put in that order, one at a time."""
    pid = (keys >> 32).astype(np.int32)
    order = np.lexsort((read["start"], pid))  # order[row] = read row; stable among equal starts
    sorted_pid = pid[order]
    del pid
    heads = np.flatnonzero(np.r_[True, sorted_pid[1:] != sorted_pid[:-1]])
    pids, at = sorted_pid[heads].astype(np.int64), np.r_[heads, len(keys)]
    del sorted_pid
    for name in list(read):
        read[name] = read[name][order]
    place = np.empty(len(keys), dtype=np.int32)
    place[order] = np.arange(len(keys), dtype=np.int32)
    return pids, at, place


def _sorted_keys(keys: np.ndarray, place: np.ndarray):
    """The keys sorted (stable), and the row each sorted key belongs to."""
    order = np.argsort(keys, kind="stable")
    return keys[order], place[order]


def rowids(db, table: str) -> tuple[int, int]:
    """The table's first and last rowid (no count: COUNT(*) reads every page). Two queries: SQLite
    finds a lone MIN or MAX of the rowid at the b-tree's edge, but scans every row for the pair."""
    low = db.execute(f"SELECT MIN(rowid) FROM {table}").fetchone()[0]
    high = db.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]
    return (0, -1) if low is None else (low, high)


def _chunks(sql: str, span: tuple[int, int], where: str = ""):
    """The query over successive rowid ranges of CHUNK, in rowid order."""
    low, high = span
    for first in range(low, high + 1, CHUNK):
        yield f"{sql} WHERE {where}rowid >= {first} AND rowid < {first + CHUNK} ORDER BY rowid"


def _fill(export: Path, queries: dict, out: dict) -> int:
    """Each table's rows, in order, into the arrays of `out`; returns how many."""
    at = 0
    for sql, span in queries.values():
        for chunk in _chunks(sql, span):
            read = read_columns(export, chunk, {name: "i8" for name in out})
            rows = len(read[next(iter(out))])
            for name, array in out.items():
                array[at:at + rows] = read[name]
            at += rows
    return at


def _activity_sql(table: str, have: set, string_ids: bool) -> str:
    """Per row: its key, process (high 32 bits) and correlation id (low 32; LOW where none), and
    the columns the analysis uses."""
    corr = f"(COALESCE(correlationId, {LOW}) & {LOW})" if "correlationId" in have else str(LOW)
    head = f"SELECT ({PID.format('globalPid')} << 32) | {corr} AS key, start, end, deviceId AS device"
    if table != KERNELS:
        return f"{head}, {NO_NAME} AS name, {MISSING} AS full FROM {table}"
    name = f"COALESCE(shortName, {EMPTY_NAME})" if string_ids else str(EMPTY_NAME)
    full = f"COALESCE(demangledName, {MISSING})" if "demangledName" in have and string_ids else str(MISSING)
    return f"{head}, {name} AS name, {full} AS full FROM {table}"


def _strings(db, tables: set, ids: np.ndarray) -> dict:
    """StringIds id -> value for the ids used; one string object per name (names run to kilobytes)."""
    wanted = np.unique(ids)
    wanted = wanted[wanted >= 0].tolist()
    if not wanted or "StringIds" not in tables:
        return {}
    found = {}
    for i in range(0, len(wanted), 500):
        chunk = wanted[i:i + 500]
        found.update(db.execute(f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(chunk))})", chunk))
    return found


def _link(db, tables, columns, export: Path, held: list):
    """Per row: the thread (an index into the threads returned) and start of the first runtime
    call (by start, then rowid) of the same process with its correlation id; ids repeat across
    processes, and within one (runtime and driver call). held: [the rows' keys, sorted; the row
    of each], taken over (emptied) so that the keys go before the result's columns are made.
    The calls are read a chunk at a time, keeping each key's best call so far."""
    wanted, dest = held
    held.clear()
    n = len(wanted)
    if RUNTIME not in tables or not {"correlationId", "globalTid"} <= columns(db, RUNTIME):
        return np.full(n, -1, dtype=np.int32), np.full(n, MISSING, dtype=np.int64), np.array([MISSING])
    best_start = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    best = np.full(n, -1, dtype=np.int32)  # an index into threads
    threads: dict[int, int] = {}  # global thread id -> its index, in order of appearance
    sql = (f"SELECT start, COALESCE(globalTid, 0) AS tid, ({PID.format('globalTid')} << 32) | "
           f"(correlationId & {LOW}) AS key FROM {RUNTIME}")
    for chunk in _chunks(sql, rowids(db, RUNTIME), "correlationId IS NOT NULL AND "):
        calls = read_columns(export, chunk, {"start": "i8", "tid": "i8", "key": "i8"})
        at = np.minimum(np.searchsorted(wanted, calls["key"]), n - 1)
        hit = np.flatnonzero((wanted[at] == calls["key"]) & ((calls["key"] & LOW) != LOW))
        at, start, tid = at[hit], calls["start"][hit], calls["tid"][hit]
        first = np.lexsort((start, at))  # by row, then start; stable: the earlier rowid among equal starts
        at, start, tid = at[first], start[first], tid[first]
        lead = np.r_[True, at[1:] != at[:-1]]
        at, start, tid = at[lead], start[lead], tid[lead]
        better = start < best_start[at]
        seen, code = np.unique(tid[better], return_inverse=True)
        codes = np.array([threads.setdefault(t, len(threads)) for t in seen.tolist()], dtype=np.int32)
        best_start[at[better]], best[at[better]] = start[better], codes[code.reshape(-1)]
    # Rows with the same key share the call of the first (searchsorted finds the first of equal keys).
    repeats = np.flatnonzero(wanted[1:] == wanted[:-1]) + 1
    heads = np.flatnonzero(np.r_[True, wanted[1:] != wanted[:-1]])
    of = heads[np.searchsorted(heads, repeats, side="right") - 1]
    best_start[repeats], best[repeats] = best_start[of], best[of]
    best_start[best == -1] = MISSING
    del wanted, repeats, heads, of
    launched = np.empty(n, dtype=np.int64)
    launched[dest] = best_start
    del best_start
    thread = np.empty(n, dtype=np.int32)
    thread[dest] = best
    del best, dest
    threads_array = np.array([*threads, MISSING], dtype=np.int64)
    return thread, launched, threads_array
