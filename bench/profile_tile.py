"""Make a large nsys export from a small real one: its CUDA activity repeated K times in time.

Kernels, runtime calls, copies and memsets are copied K times, each copy shifted by the
source's span (plus a gap) and its correlation ids shifted past the source's largest, so
every copy's launches still link to its own kernels. The source's own NVTX ranges (PyTorch's
`aten::...`) are dropped and replaced by ours (docs/PROFILING.md): on each process's main thread a
`rank r` mark, then `epochs` epochs of `batches` batches over the whole tiled span, each batch
split into the phases of PHASE_SPLIT. docs/RESULTS.md ("Profile analysis at scale") uses it.
"""
import shutil
import sqlite3
from pathlib import Path

from handler.runtime.names import BACKWARD, BATCH, DATA, EPOCH, FORWARD, H2D, OPTIMIZER, RANK

TILED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
         "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
# Each batch: these phases one after another, as fractions of the batch; the last 5 % is "other".
PHASE_SPLIT = ((DATA, 0.10), (H2D, 0.05), (FORWARD, 0.30), (BACKWARD, 0.40), (OPTIMIZER, 0.10))
GAP_NS = 1000
PID = "(globalTid >> 24) & 16777215"


def tile(source: Path, target: Path, copies: int, epochs: int, batches: int) -> dict:
    """Write the tiled export to target; returns its row counts per table and the NVTX layout."""
    shutil.copyfile(source, target)
    target.chmod(0o644)
    with sqlite3.connect(target) as db:
        tables = [t for t in TILED if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone()]
        first, last = _span(db, tables)
        period = last - first + GAP_NS
        corr = 1 + max(db.execute(f"SELECT COALESCE(MAX(correlationId), 0) FROM {t}").fetchone()[0] for t in tables)
        for table in tables:
            _repeat(db, table, copies, period, corr)
        threads = _main_threads(db)
        db.execute("DELETE FROM NVTX_EVENTS")
        db.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                       "VALUES (?, ?, ?, ?, ?, 0)", _training_ranges(threads, first, first + copies * period,
                                                                      epochs, batches))
        counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in (*tables, "NVTX_EVENTS")}
    return {"rows": counts, "copies": copies, "period_ns": period, "epochs": epochs, "batches": batches}


def _span(db, tables) -> tuple[int, int]:
    spans = [db.execute(f"SELECT MIN(start), MAX(end) FROM {t}").fetchone() for t in tables]
    return min(s for s, _ in spans if s is not None), max(e for _, e in spans if e is not None)


def _repeat(db, table: str, copies: int, period: int, corr: int) -> None:
    columns: list[str] = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
    shifted = {"start": "start + k * ?1", "end": "end + k * ?1", "correlationId": "correlationId + k * ?2"}
    select = ", ".join(shifted[c] if c in shifted else c for c in columns)
    db.execute(f"CREATE TEMP TABLE source AS SELECT * FROM {table}")
    db.execute(f"WITH RECURSIVE n(k) AS (SELECT 1 WHERE ?3 >= 1 UNION ALL SELECT k + 1 FROM n WHERE k < ?3) "
               f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM n, source ORDER BY k, start",
               (period, corr, copies - 1))
    db.execute("DROP TABLE temp.source")


def _main_threads(db) -> list[int]:
    """Each process's main thread (tid == pid) among those that made CUDA runtime calls."""
    tids = db.execute(f"SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                      f"WHERE {PID} = globalTid & 16777215").fetchall()
    return sorted(t for (t,) in tids)


def _training_ranges(threads: list[int], start: int, end: int, epochs: int, batches: int):
    """(start, end, eventType, text, globalTid) rows: marks (type 34) and push/pop ranges (59)."""
    epoch_ns = (end - start) // epochs
    batch_ns = epoch_ns // batches
    for rank, tid in enumerate(threads):
        yield start - 500, None, 34, RANK(rank), tid
        for e in range(epochs):
            e0 = start + e * epoch_ns
            yield e0, e0 + batch_ns * batches, 59, EPOCH(e), tid
            for b in range(batches):
                b0 = e0 + b * batch_ns
                yield b0, b0 + batch_ns, 59, BATCH(b), tid
                at = b0
                for name, fraction in PHASE_SPLIT:
                    length = int(batch_ns * fraction)
                    yield at, at + length, 59, name, tid
                    at += length
