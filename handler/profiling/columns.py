"""GPU activity as numpy columns: a 30-epoch capture holds millions of kernels and runtime calls.

One Python object per kernel took 2.3 GB and 44 s for 2.0 M kernels (docs/RESULTS.md,
"Profile analysis at scale"); columns take about 64 bytes a row, and the launching runtime call
is joined in numpy (sort and searchsorted) instead of a dict of millions of tuples. Rows stream
from SQLite straight into the arrays (np.fromiter), never through a list.
"""
from dataclasses import dataclass

import numpy as np

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
TRANSFERS = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NO_NAME = -1  # a copy or memset: it has no name
EMPTY_NAME = -2  # a kernel whose name the export does not give
MISSING = -1  # no runtime call linked, no demangled name
ROW = np.dtype([("gpid", "i8"), ("device", "i8"), ("start", "i8"), ("end", "i8"), ("name", "i8"),
                ("corr", "i8"), ("full", "i8")])
CALL = np.dtype([("start", "i8"), ("tid", "i8"), ("corr", "i8")])


def pid_of(global_id):
    return (global_id >> 24) & 0xFFFFFF


@dataclass(frozen=True, eq=False)
class GpuColumns:
    """Kernels, then copies, then memsets, each in start order (no number depends on the order).

    name: a StringIds id into `names` (NO_NAME for copies and memsets, EMPTY_NAME for ''); tid and
    launched: the launching runtime call's thread and start (MISSING where no call links);
    full: an id into `full_names` (demangled kernel names), MISSING where not exported."""
    pid: np.ndarray
    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray
    tid: np.ndarray
    launched: np.ndarray
    full: np.ndarray
    names: dict  # StringIds id -> short kernel name
    full_names: dict  # StringIds id -> demangled kernel name

    def __len__(self) -> int:
        return len(self.start)

    def rows(self, mask: np.ndarray) -> "GpuColumns":
        return GpuColumns(**{f: getattr(self, f)[mask] for f in _ARRAYS}, names=self.names, full_names=self.full_names)

    def of_pid(self, pid: int) -> "GpuColumns":
        return self.rows(self.pid == pid)

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
        ids = np.unique(self.full)
        hits = [i for i in ids.tolist() if self.full_names.get(i) and pattern.search(self.full_names[i])]
        return np.isin(self.full, hits)

    def _by_name(self, test) -> np.ndarray:
        ids = np.unique(self.name)
        hits = [i for i in ids.tolist() if test(self.names.get(i, "") if i >= 0 else ("" if i == EMPTY_NAME else None))]
        return np.isin(self.name, hits)


_ARRAYS = ("pid", "device", "start", "end", "name", "tid", "launched", "full")


def from_rows(rows, names=None, full_names=None) -> GpuColumns:
    """Columns from (pid, device, start, end, name or None, tid or None, launched or None) tuples:
    for tests that build activity by hand."""
    names = dict(names or {})
    ids = {n: i for i, n in names.items()}
    arrays = {f: [] for f in _ARRAYS}
    for pid, device, start, end, name, tid, launched in rows:
        if name not in ids and name:
            ids[name] = len(names)
            names[len(names)] = name
        for f, v in zip(_ARRAYS, (pid, device, start, end, NO_NAME if name is None else ids.get(name, EMPTY_NAME),
                                  MISSING if tid is None else tid, MISSING if launched is None else launched,
                                  MISSING)):
            arrays[f].append(v)
    return GpuColumns(**{f: np.array(arrays[f], dtype=np.int64) for f in _ARRAYS}, names=names,
                      full_names=dict(full_names or {}))


def load_gpu(db, tables: set, columns) -> GpuColumns | None:
    """The export's kernels, copies and memsets, linked to their runtime calls; None without any."""
    queries = [(_activity_query(t, columns(db, t), "StringIds" in tables), _count(db, t))
               for t in (KERNELS, *TRANSFERS) if t in tables]
    rows = np.empty(sum(n for _, n in queries), dtype=ROW)
    at = 0
    for sql, n in queries:  # each table straight into its slice: no list, no concatenated copy
        rows[at:at + n] = np.fromiter(db.execute(sql), dtype=ROW, count=n)
        at += n
    if not len(rows):
        return None
    tid, launched = _link(db, tables, columns, pid_of(rows["gpid"]), rows["corr"])
    names = _strings(db, tables, rows["name"][rows["name"] >= 0])
    full_names = _strings(db, tables, rows["full"][rows["full"] >= 0])
    # Views into the one record array, not copies: 56 bytes a row for these five columns.
    return GpuColumns(pid=pid_of(rows["gpid"]), device=rows["device"], start=rows["start"], end=rows["end"],
                      name=rows["name"], tid=tid, launched=launched, full=rows["full"], names=names,
                      full_names=full_names)


def _count(db, table: str) -> int:
    return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _activity_query(table: str, have: set, string_ids: bool) -> str:
    corr = "COALESCE(correlationId, -1)" if "correlationId" in have else "-1"
    if table != KERNELS:
        return f"SELECT globalPid, deviceId, start, end, {NO_NAME}, {corr}, {MISSING} FROM {table} ORDER BY start"
    name = f"COALESCE(shortName, {EMPTY_NAME})" if string_ids else str(EMPTY_NAME)
    full = f"COALESCE(demangledName, {MISSING})" if "demangledName" in have and string_ids else str(MISSING)
    return f"SELECT globalPid, deviceId, start, end, {name}, {corr}, {full} FROM {table} ORDER BY start"


def _strings(db, tables: set, ids: np.ndarray) -> dict:
    """StringIds id -> value for the ids used; one string object per name (names run to kilobytes)."""
    wanted = np.unique(ids).tolist()
    if not wanted or "StringIds" not in tables:
        return {}
    found = {}
    for i in range(0, len(wanted), 500):
        chunk = wanted[i:i + 500]
        found.update(db.execute(f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(chunk))})", chunk))
    return found


def _link(db, tables, columns, pid: np.ndarray, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: thread and start of the first runtime call (in start order) of the same process
    with its correlation id; ids repeat across processes, and within one (runtime and driver call)."""
    tid = np.full(len(pid), MISSING, dtype=np.int64)
    launched = tid.copy()
    if RUNTIME not in tables or not {"correlationId", "globalTid"} <= columns(db, RUNTIME):
        return tid, launched
    where = f"FROM {RUNTIME} WHERE correlationId IS NOT NULL"
    count = db.execute(f"SELECT COUNT(*) {where}").fetchone()[0]
    calls = np.fromiter(db.execute(f"SELECT start, globalTid, correlationId {where} ORDER BY start"),
                        dtype=CALL, count=count)
    keys, first = np.unique(_key(pid_of(calls["tid"]), calls["corr"]), return_index=True)
    if not len(keys):
        return tid, launched
    wanted = _key(pid, corr)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    hit = (keys[at] == wanted) & (corr != MISSING)
    tid[hit] = calls["tid"][first[at[hit]]]
    launched[hit] = calls["start"][first[at[hit]]]
    return tid, launched


def _key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """pid (24 bits) and correlation id (32 bits) in one int64."""
    return (pid << 32) | (corr & 0xFFFFFFFF)
