"""The analysis at scale: tiled exports (bench/profile_tile.py) and numbers kept bit for bit.

golden_summaries.json holds what the analysis computed before it was rewritten to scale
(tests/profiling/scale_inputs.py says how it was made); the rewrite must give the same.
"""
import json
import sqlite3

import pytest

from bench.profile_tile import tile
from handler.profiling.analysis import summarize
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS
from tests.profiling.scale_inputs import GOLDEN, build, summaries


# Keys added after the golden file was written (docs/PROFILING.md, "Any training profile"): each
# summary must hold them, and everything else must equal the golden file bit for bit.
ADDED = {"convention", "gpus", "model", "run", "measured_epoch"}
ADDED_PER_RANK = {"setup", "setup_libraries", "loop", "nccl_ranges", "host", "host_from"}  # host: checked below


def test_summaries_of_the_real_exports_equal_the_old_analysis_bit_for_bit(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    now, paths = summaries(tmp_path), build(tmp_path)
    assert sorted(now) == sorted(golden)
    for name in golden:
        assert ADDED <= set(now[name]) and all(ADDED_PER_RANK <= set(r) for r in now[name]["ranks"])
        old = {k: v for k, v in now[name].items() if k not in ADDED}
        old["ranks"] = [{k: v for k, v in r.items() if k not in ADDED_PER_RANK} for r in old["ranks"]]
        assert not differences(old, golden[name]), (name, differences(old, golden[name])[:10])
        assert now[name]["convention"] == "ours"
        hostname = _hostname(paths[name])  # no host mark in these: the export's own Hostname, where it has one
        assert [(r["host"], r["host_from"]) for r in now[name]["ranks"]] == [
            (hostname, "export Hostname") if hostname else (None, "not recorded: no host mark, Hostname or metrics env.hosts")
        ] * len(now[name]["ranks"])


def _hostname(export) -> str | None:
    with sqlite3.connect(export) as db:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_SYSTEM_ENV'").fetchone():
            return None
        row = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()
    return row[0] if row else None


def differences(a, b, at="") -> list[str]:
    """Paths where two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b and type(a) is type(b) else [f"{at}: {a!r} != {b!r}"]


@pytest.mark.parametrize("copies", [2, 5])
def test_a_tiled_export_has_exactly_k_times_the_kernel_seconds(tmp_path, copies):
    one = summarize(load_trace(_tiled(tmp_path / "one.sqlite", 1)))
    many = summarize(load_trace(_tiled(tmp_path / "many.sqlite", copies)))
    for a, b in zip(one["ranks"], many["ranks"]):
        assert a["gpu"]["kernels"] * copies == b["gpu"]["kernels"]
        assert round(b["gpu"]["kernel_time_s"] * 1e9) == copies * round(a["gpu"]["kernel_time_s"] * 1e9)
        assert round(b["gpu"]["nccl_time_s"] * 1e9) == copies * round(a["gpu"]["nccl_time_s"] * 1e9)
    assert len(many["ranks"]) == len(one["ranks"]) == 2


def _tiled(path, copies):
    tile(REAL_EXPORTS["2026.2"], path, copies=copies, epochs=1, batches=4 * copies)
    return path


@pytest.mark.slow  # an end-to-end run of 13-17 s: CI's slow step (the main run's 10 minutes)
def test_bench_profile_scale_quick_runs_old_and_new_side_by_side(tmp_path):
    """bench.profile_scale --quick: sizes 1 and 2, this checkout against HEAD's code (git archive);
    both must print the same summary. Numbers are not timed here."""
    import subprocess
    import sys

    from tests.nsys_helpers import REPO
    out = tmp_path / "scale.json"
    run = subprocess.run([sys.executable, "-m", "bench.profile_scale", "--quick", "--ref", "HEAD", "--json", str(out)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    sizes = result["sizes"]
    assert [s["copies"] for s in sizes] == [1, 2]
    if result["nsys"]:  # nsys stats beside ours, where installed: the ratios of each round
        assert all(s["nsys"]["peak_mb"] > 0 and s["over_nsys"]["cpu_s"] > 0 for s in sizes)
    assert sizes[1]["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"] == 2 * sizes[0]["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"]
    for size in sizes:
        assert size["same_summary"] and size["new"]["line"].startswith("profile: ")
        assert size["new"]["peak_mb"] > 0 and size["old"]["peak_mb"] > 0 and size["new"]["seconds"] > 0


def _reference_rows(export) -> list[tuple]:
    """(pid, device, start, end, name, full, tid, launched) of every kernel, copy and memset, the way
    the reader before the columnar one joined them (the first runtime call by start of the same process
    with the correlation id), here written as plain SQL with an index."""
    import sqlite3
    pid = "((COALESCE({0}, 0) >> 24) & 16777215)"
    with sqlite3.connect(export) as db:
        db.execute("CREATE INDEX IF NOT EXISTS runtime_corr ON CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)")
        rows = []
        for table, name, full in (("CUPTI_ACTIVITY_KIND_KERNEL", "shortName", "demangledName"),
                                  ("CUPTI_ACTIVITY_KIND_MEMCPY", "-1", "-1"), ("CUPTI_ACTIVITY_KIND_MEMSET", "-1", "-1")):
            call = (f"FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = a.correlationId AND "
                    f"{pid.format('r.globalTid')} = {pid.format('a.globalPid')} ORDER BY r.start, r.rowid LIMIT 1")
            rows += db.execute(f"SELECT {pid.format('a.globalPid')}, a.deviceId, a.start, a.end, {name}, {full}, "
                               f"COALESCE((SELECT r.globalTid {call}), -1), COALESCE((SELECT r.start {call}), -1) "
                               f"FROM {table} a").fetchall()
    return rows


def test_the_columnar_reader_gives_every_row_the_old_join_and_each_rank_its_sql_kernel_seconds(tmp_path, monkeypatch):
    """8 copies (28 k kernels, 53 k runtime calls) read in chunks of 1000 rowids, so keys, calls and
    their duplicates meet across chunks; one call is added earlier than a kernel's own, from another
    thread of its process: the first by start must win, as before."""
    import sqlite3

    import numpy as np

    from handler.profiling import columns
    export = _tiled(tmp_path / "x8.sqlite", 8)
    with sqlite3.connect(export) as db:
        corr, gpid, start = db.execute("SELECT correlationId, globalPid, start FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                       "WHERE rowid = 20000").fetchone()
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
                   "returnValue, callchainId) SELECT ?, ?, eventClass, ?, ?, nameId, returnValue, callchainId FROM "
                   "CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1", (start - 10**6, start - 10**6 + 5, gpid + 7, corr))
    monkeypatch.setattr(columns, "CHUNK", 1000)
    trace = load_trace(export)
    gpu = trace.gpu
    assert gpu is not None and len(gpu) > 3 * columns.CHUNK
    got = sorted(zip(gpu.pid.tolist(), gpu.device.tolist(), gpu.start.tolist(), gpu.end.tolist(),
                     np.where(gpu.name == columns.NO_NAME, -1, gpu.name).tolist(), gpu.full.tolist(),
                     gpu.tid.tolist(), gpu.launched.tolist()))
    want = sorted(_reference_rows(export))
    assert got == want
    assert (gpid + 7, start - 10**6) in {(r[6], r[7]) for r in want}
    for p in trace.processes:  # rows grouped by process, each in start order
        own = gpu.of_pid(p.pid)
        assert (own.pid == p.pid).all() and (np.diff(own.start) >= 0).all()
    summary = summarize(trace)
    with sqlite3.connect(export) as db:
        for rank, p in zip(summary["ranks"], trace.processes):
            ns = db.execute("SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                            "WHERE ((globalPid >> 24) & 16777215) = ?", (p.pid,)).fetchone()[0]
            assert rank["gpu"]["kernel_time_s"] == ns / 1e9
