"""The pp bubble on GPU traces comes from each stage's kernels, not from `fwd`/`bwd`/`recv`
ranges that only time launches (NCCL's wait() only makes the stream wait).

On a copy of the real 2026.2 export (two processes, real kernels and NCCL send/recv) with pp
ranges added, and on a hand-built stage whose numbers are known exactly. Expected numbers come
from an SQL join launch -> range and a 100 ns bitmap.
"""
import bisect
import sqlite3

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.render import markdown
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS
from tests.nsys_rows import KERNEL, MEMCPY, MEMSET, RUNTIME, add_range
from tests.profiling.test_profile_gpu import BASE_TABLES, MS, PID, Bitmap, rank_of

# One batch of a stage: pieces one after another, as fractions of the batch; the last 5 % is the optimizer.
PP_SPLIT = (("recv", 0.05), ("fwd mb0", 0.15), ("send", 0.05), ("fwd mb1", 0.15), ("recv", 0.05),
            ("bwd mb0", 0.20), ("send", 0.05), ("bwd mb1", 0.20), ("send", 0.05))


def with_pp_ranges(source, target, batches=3):
    """Copy a real export and give each process's main thread `rank r`, `epoch 0`, `batch i` and,
    in each batch, the pp ranges of PP_SPLIT (`fwd`/`bwd` inside `forward`/`backward`, as
    handler/PP/schedule.py nests them), then `optimizer`. Returns pid -> (tid, batches, pieces)."""
    target.write_bytes(source.read_bytes())
    db = sqlite3.connect(target)
    threads = sorted(t for (t,) in db.execute(f"SELECT DISTINCT globalTid FROM {RUNTIME}")
                     if (t >> 24) & 0xFFFFFF == t & 0xFFFFFF)
    layout = {}
    for rank, tid in enumerate(threads):
        pid = tid & 0xFFFFFF
        start = db.execute(f"SELECT MIN(start) FROM {RUNTIME} WHERE {PID % 'globalTid'} = ?", (pid,)).fetchone()[0]
        end = db.execute(f"SELECT MAX(start) FROM {RUNTIME} WHERE {PID % 'globalTid'} = ?", (pid,)).fetchone()[0] + 1
        step = (end - start) // batches
        add_range(db, f"rank {rank}", start - 500, None, tid)
        add_range(db, "epoch 0", start, start + step * batches, tid)
        spans, pieces = [], []
        for i in range(batches):
            at = start + i * step
            spans.append((at, at + step))
            add_range(db, f"batch {i}", at, at + step, tid)
            for name, fraction in PP_SPLIT:
                length = int(step * fraction)
                pieces.append((name, at, at + length, i))
                add_range(db, name, at, at + length, tid)
                if name[:3] in ("fwd", "bwd"):
                    add_range(db, {"fwd": "forward", "bwd": "backward"}[name[:3]], at, at + length, tid)
                at += length
            add_range(db, "optimizer", at, at + step // 20, tid)
        layout[pid] = (tid, spans, pieces)
    db.commit()
    db.close()
    return layout


def expected_stage(db, pid, pieces):
    """(busy, wait, span) in seconds from an SQL join launch -> piece and a bitmap per batch."""
    starts = [p[1] for p in pieces]
    per_batch = {}
    for table in (KERNEL, MEMCPY, MEMSET):
        name = "s.value" if table == KERNEL else "NULL"
        join = "JOIN StringIds s ON s.id = a.shortName" if table == KERNEL else ""
        rows = db.execute(f"""
            WITH r AS MATERIALIZED (SELECT correlationId, {PID % 'globalTid'} AS pid, MIN(start) AS start
                                    FROM {RUNTIME} GROUP BY 1, 2)
            SELECT a.start, a.end, {name}, r.start FROM {table} a {join}
            JOIN r ON r.correlationId = a.correlationId AND r.pid = {PID % 'a.globalPid'}
            WHERE {PID % 'a.globalPid'} = ?""", (pid,)).fetchall()
        for start, end, kernel, launched in rows:
            i = bisect.bisect_right(starts, launched) - 1
            if i >= 0 and launched < pieces[i][2]:  # our pieces sit only on the main thread
                per_batch.setdefault(pieces[i][3], []).append((start, end, kernel, pieces[i][0]))
    busy = wait = span = 0.0
    for rows in per_batch.values():
        first, last = min(r[0] for r in rows), max(r[1] for r in rows)
        work, nccl = Bitmap(first, last), Bitmap(first, last)
        for start, end, kernel, piece in rows:
            if kernel and "nccl" in kernel.lower():
                nccl.set(start, end)
            elif piece[:3] in ("fwd", "bwd"):
                work.set(start, end)
        busy += work.seconds()
        wait += nccl.seconds() - nccl.seconds(work)
        span += (last - first) / 1e9
    return busy, wait, span


@pytest.fixture(scope="module")
def pp_export(tmp_path_factory):
    export = tmp_path_factory.mktemp("pp") / "pp.sqlite"
    layout = with_pp_ranges(REAL_EXPORTS["2026.2"], export)
    return export, layout, summarize(load_trace(export))


def test_pp_bubble_on_a_gpu_trace_comes_from_each_stages_kernels(pp_export):
    export, layout, summary = pp_export
    db = sqlite3.connect(export)
    cpu_busy = sum(f for name, f in PP_SPLIT if name[:3] in ("fwd", "bwd")) / sum(f for _, f in PP_SPLIT)
    for pid, (_, _, pieces) in layout.items():
        stage = rank_of(summary, pid)["pipeline"]
        busy, wait, span = expected_stage(db, pid, pieces)
        assert stage["source"] == "gpu kernels"
        assert stage["span_s"] == pytest.approx(span, abs=1e-6)
        assert stage["busy_share"] == pytest.approx(busy / span, abs=2e-3)
        assert stage["bubble_share"] == pytest.approx(1 - busy / span, abs=2e-3)
        assert stage["wait_share"] == pytest.approx(wait / span, abs=2e-3)
        # The CPU ranges tell another story here; they stay beside the GPU numbers.
        assert stage["cpu_ranges"]["busy_share"] == pytest.approx(cpu_busy, abs=1e-3)
        assert abs(stage["busy_share"] - cpu_busy) > 0.05
    assert any(rank_of(summary, pid)["pipeline"]["wait_share"] > 0 for pid in layout)  # NCCL send/recv kernels


def test_pp_report_names_where_its_bubble_comes_from(pp_export):
    page = markdown(pp_export[2], "pp")
    section = page[page.index("## Pipeline (pp)"):]
    assert "| source |" in section and section.count("| gpu kernels |") == len(pp_export[1])


def hand_built_stage(path, with_runtime=True):
    """One stage (pid 5) of two, one batch 0-100 ms; ranges on the main thread, kernels later on the GPU.
    Backward's first kernel is launched by an autograd thread without ranges, as torch does."""
    db = sqlite3.connect(path)
    db.executescript(BASE_TABLES + "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME "
                     "(start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER);")
    main, autograd, other = 5 << 24 | 5, 5 << 24 | 6, 6 << 24 | 6
    ranges = [("epoch 0", 0, 100), ("batch 0", 0, 100), ("fwd mb0", 0, 10), ("send", 10, 12), ("fwd mb1", 12, 22),
              ("recv", 22, 60), ("bwd mb0", 60, 70), ("bwd mb1", 70, 80), ("optimizer", 80, 90)]
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)",
                   [(a * MS, b * MS, n, main) for n, a, b in ranges])
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)",  # stage 1: another process
                   [(0, 100 * MS, "epoch 0", other), (0, 100 * MS, "batch 0", other), (0, 50 * MS, "fwd mb1", other)])
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "sgemm"), (2, "ncclDevKernel_SendRecv")])
    # (launch ms, thread, kernel start ms, end ms, name id)
    launches = [(1, main, 5, 25, 1), (11, main, 25, 30, 2), (13, main, 30, 50, 1), (23, main, 50, 70, 2),
                (61, autograd, 70, 85, 1), (71, main, 85, 95, 1), (81, main, 95, 99, 1)]
    for corr, (launch, tid, start, end, name) in enumerate(launches):
        if with_runtime:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)",
                       (launch * MS, launch * MS + 1, tid, corr))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, ?)",
                   (start * MS, end * MS, 5 << 24, name, corr))
    db.commit()
    db.close()
    return path


def test_pp_gpu_bubble_counts_nccl_waits_and_leaves_the_optimizer_out(tmp_path):
    stage = summarize(load_trace(hand_built_stage(tmp_path / "stage.sqlite")))["ranks"][0]["pipeline"]
    # GPU: span 5-95 ms; busy = compute launched in fwd/bwd (20+20+15+10); the NCCL kernels
    # (25-30, 50-70) are waiting; the optimizer's kernel (95-99) is not pipeline work.
    assert stage["source"] == "gpu kernels"
    assert stage["span_s"] == pytest.approx(0.090)
    assert stage["busy_share"] == pytest.approx(65 / 90) and stage["bubble_share"] == pytest.approx(25 / 90)
    assert stage["wait_share"] == pytest.approx(25 / 90)
    # CPU ranges: span 0-80 ms, fwd/bwd ranges 40 ms of it.
    assert stage["cpu_ranges"] == pytest.approx({"busy_share": 0.5, "bubble_share": 0.5, "wait_share": 0.5,
                                                 "span_s": 0.080})


def test_pp_on_an_export_without_launch_links_says_it_shows_cpu_ranges(tmp_path):
    summary = summarize(load_trace(hand_built_stage(tmp_path / "stage.sqlite", with_runtime=False)))
    stage = summary["ranks"][0]["pipeline"]
    assert stage["source"] == "cpu ranges" and "no GPU activity is linked" in stage["note"]
    assert stage["busy_share"] == pytest.approx(0.5)
    assert "Note: no GPU activity is linked" in markdown(summary, "stage")
