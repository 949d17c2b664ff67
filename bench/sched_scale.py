"""The scheduling-event reader at the size real captures have: seconds by rows, columns against rows.

    python -m bench.sched_scale [--sizes 1,4] [--rounds N] [--quick] [--json PATH]

A copy of the 2-rank DataLoader export of tests/data/nsys gets a SCHED_EVENTS table of M million
rows (each rank's main thread and a worker's thread scheduled in and out in turn across the capture,
a tenth of the rows outside the epochs, a hundredth of no thread). Side by side, round by round:
handler/profiling/scaling/sched.report_cpu_time (the events as columns, sql_columns.read_columns)
and the reader it replaced (one Python tuple per row from a sqlite3 cursor, ordered by SQLite),
which must give the same CPU time. docs/RESULTS.md has the figures.
"""
import shutil
import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path
from statistics import median

from bench.common import ROOT, alternate, context, emit, parser, ratio, table
from handler.profiling.scaling.sched import epoch_windows, report_cpu_time
from handler.profiling.scaling.workers import LoaderProcesses
from handler.profiling.trace import load_trace

SOURCE = ROOT / "tests" / "data" / "nsys" / "ddp_workers2_cpu2_nsys2022.4.sqlite"
RANKS = (31396, 31397)
THREADS = (282001714215588, 282001730992805, 282006210509744)  # the two ranks' main threads (31396, 31397), a worker (31664)
WORKER = 31664


def with_events(target: Path, rows: int) -> None:
    shutil.copyfile(SOURCE, target)
    with closing(sqlite3.connect(target)) as db:
        db.execute("CREATE TABLE SCHED_EVENTS (start INTEGER NOT NULL, cpu INTEGER NOT NULL, "
                   "isSchedIn INTEGER NOT NULL, globalTid INTEGER)")
        span = 12_000_000_000  # the capture's 12 s; its epochs 1.5-10.4 s (nine tenths of it inside)
        db.execute(f"""WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {rows})
            INSERT INTO SCHED_EVENTS SELECT (i / 2) * ({span} / ({rows} / 2)) + (i % 2) * 1000 * (i % 7 + 1), i % 4,
            (i + 1) % 2, CASE WHEN i % 100 = 99 THEN NULL
                              ELSE CASE (i / 2) % 3 WHEN 0 THEN {THREADS[0]} WHEN 1 THEN {THREADS[1]}
                              ELSE {THREADS[2]} END END FROM n""")
        db.commit()


def per_row(export: Path, windows: list[tuple[int, int]], steps: int) -> tuple[float, float]:
    """The reader before: one tuple per row, each interval clipped to the windows in Python."""
    spent = {"loader": 0, "rank": 0}
    running: dict[int, int] = {}
    with closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
        for start, into, tid in db.execute("SELECT start, isSchedIn, globalTid FROM SCHED_EVENTS "
                                           "WHERE globalTid IS NOT NULL ORDER BY start"):
            pid = (tid >> 24) & 0xFFFFFF
            part = "rank" if pid in RANKS else "loader" if pid == WORKER else None
            if part is None:
                continue
            if into:
                running[tid] = start
            elif tid in running:
                a = running.pop(tid)
                spent[part] += sum(max(0, min(start, e) - max(a, s)) for s, e in windows if s < start and a < e)
    return spent["loader"] / 1e6 / steps, spent["rank"] / 1e6 / steps


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--sizes", default="1,4", help="millions of rows, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    started = context("sched_scale")
    sizes = [0.02] if args.quick else [float(s) for s in args.sizes.split(",")]
    processes = load_trace(SOURCE).processes
    windows = epoch_windows(processes)
    ranks = [{"pid": pid, "loop": {"steps": 10}} for pid in RANKS]
    loaders = LoaderProcesses((WORKER,), ())
    rows, results = [], []
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            export = Path(folder) / f"sched_{size:g}M.sqlite"
            with_events(export, int(size * 1e6))

            def columns(export=export) -> tuple[float, tuple[float, float]]:
                t = time.perf_counter()
                found = report_cpu_time(export, ranks, windows, loaders, {})
                return time.perf_counter() - t, (found["loader_cpu_ms"], found["rank_cpu_ms"])

            def rows_(export=export) -> tuple[float, tuple[float, float]]:
                t = time.perf_counter()
                found = per_row(export, windows, 20)
                return time.perf_counter() - t, found

            timed = alternate({"columns": columns, "rows": rows_}, args.rounds)
            same = all(abs(a - b) < 1e-6 * max(1.0, abs(b)) for (_, x), (_, y) in zip(timed["columns"], timed["rows"])
                       for a, b in zip(x, y))
            fast, slow = median(t for t, _ in timed["columns"]), median(t for t, _ in timed["rows"])
            rows.append([f"{size:g} M", fast, slow, ratio(slow, fast), "yes" if same else "NO"])
            results.append({"million_rows": size, "columns_s": fast, "rows_s": slow, "speedup": ratio(slow, fast),
                            "same_cpu_time": same})
            export.unlink()
    text = table(["SCHED_EVENTS", "columns s", "rows s", "rows / columns", "same CPU time"], rows)
    emit("sched_scale", {"sizes": results}, args, text, started)


if __name__ == "__main__":
    main()
