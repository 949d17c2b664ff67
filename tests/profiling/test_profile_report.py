"""handler.profiling.report: real nsys captures of a 2-process toy run, hand-built exports, bad input."""
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from types import SimpleNamespace

import pytest

from handler.profiling import bubble, gpu_metrics, stats, trace
from handler.profiling.gpu_metrics import read as gpu_metrics_read, summary as gpu_metrics_summary
from handler.profiling.report import load_metrics
from handler.runtime.errors import UserError
from tests.nsys_helpers import REPO, path_without_nsys, profile, require_nsys

EPOCHS, BATCHES = 2, 6
SLEEP_MS = {"data": 4, "h2d": 2, "forward": 10, "backward": 15, "optimizer": 5}  # h2d on even batches only

# Each rank marks itself, then nests phases in batches in epochs as docs/PROFILING.md says.
# validate also pushes "forward": the analysis must not count it as training.
TOY_RUN = textwrap.dedent(f"""
    import json, sys, time
    import torch.multiprocessing as mp
    from torch.cuda import nvtx

    SLEEP_MS = {SLEEP_MS!r}

    def timed(name):
        nvtx.range_push(name)
        time.sleep(SLEEP_MS[name] / 1000)
        nvtx.range_pop()

    def worker(rank, metrics_path):
        nvtx.mark(f"rank {{rank}}")
        epochs = []
        for e in range({EPOCHS}):
            start = time.perf_counter()
            nvtx.range_push(f"epoch {{e}}")
            for i in range({BATCHES}):
                nvtx.range_push(f"batch {{i}}")
                for phase in SLEEP_MS:
                    if phase != "h2d" or i % 2 == 0:
                        timed(phase)
                nvtx.range_pop()
            nvtx.range_pop()
            epochs.append({{"epoch": e, "time_s": time.perf_counter() - start}})
            nvtx.range_push("validate")
            timed("forward")
            nvtx.range_pop()
        if rank == 0:
            json.dump({{"schema": 1, "epochs": epochs}}, open(metrics_path, "w"))

    if __name__ == "__main__":
        mp.spawn(worker, args=(sys.argv[1],), nprocs=2)
""")


def run_report(*args, env=None):
    return subprocess.run([sys.executable, "-m", "handler.profiling.report", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(report, metrics path, summary) for one nsys capture of TOY_RUN."""
    require_nsys()
    folder = tmp_path_factory.mktemp("toy")
    (folder / "toy.py").write_text(TOY_RUN)
    metrics = folder / "toy.metrics.json"
    report = profile([sys.executable, str(folder / "toy.py"), str(metrics)], folder / "toy")
    result = run_report(report, "--metrics", metrics)
    assert result.returncode == 0, result.stderr
    return report, metrics, json.loads((folder / "toy.summary.json").read_text())


def test_each_spawned_process_is_a_rank_named_by_its_mark(toy):
    summary = toy[2]
    assert summary["rank_source"] == "nvtx mark"
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert len({r["pid"] for r in summary["ranks"]}) == 2


def test_epoch_and_batch_ranges_are_counted_per_rank(toy):
    for rank in toy[2]["ranks"]:
        assert [e["epoch"] for e in rank["epochs"]] == list(range(EPOCHS))
        assert rank["batches"]["count"] == EPOCHS * BATCHES


def test_every_phase_is_counted_only_inside_batches(toy):
    expected = {name: EPOCHS * BATCHES for name in SLEEP_MS} | {"h2d": EPOCHS * len(range(0, BATCHES, 2))}
    for rank in toy[2]["ranks"]:
        assert {name: p["count"] for name, p in rank["phases"].items()} == expected
        assert rank["outside_training"]["validate"]["count"] == EPOCHS


def test_phase_shares_follow_the_sleeps(toy):
    per_batch = {name: ms * (0.5 if name == "h2d" else 1) for name, ms in SLEEP_MS.items()}
    total = sum(per_batch.values())
    for rank in toy[2]["ranks"]:
        for name, ms in per_batch.items():
            assert rank["phases"][name]["share"] == pytest.approx(ms / total, abs=0.04), name
        assert rank["batches"]["p50_ms"] == pytest.approx(total, rel=0.3)


def test_epoch_times_agree_with_the_metrics_json(toy):
    comparison = toy[2]["metrics_comparison"]
    assert [c["epoch"] for c in comparison] == list(range(EPOCHS))
    assert all(abs(c["diff_share"]) < 0.02 for c in comparison)


def test_cpu_report_has_no_gpu_numbers_and_a_one_line_summary(toy):
    summary = toy[2]
    assert summary["gpu_trace"] is False and all(r["gpu"] is None for r in summary["ranks"])
    assert re.fullmatch(r"profile: data-stall [\d.]+ %, h2d [\d.]+ %, forward [\d.]+ %, "
                        r"backward [\d.]+ %, optimizer [\d.]+ %, epoch [\d.]+ s", summary["one_line"])
    page = toy[0].with_name("toy.summary.md").read_text()
    assert summary["one_line"] in page and "| rank |" in page


def test_brief_prints_one_line_and_reuses_the_sqlite_export(toy):
    export = toy[0].with_name("toy.sqlite")
    before = export.stat().st_mtime_ns
    result = run_report(toy[0], "--brief")
    assert result.stdout.strip() == toy[2]["one_line"]
    assert export.stat().st_mtime_ns == before


# Hand-built exports: only the columns trace.py reads, with nsys' pid packing.
def fake_export(path, nvtx, kernels=(), copies=()):
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, textId INTEGER, globalTid INTEGER);
    """)
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)",
                   [(start, end, text, pid << 24 | pid) for pid, text, start, end in nvtx])
    if kernels or copies:
        db.executescript("""
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
                                                     globalPid INTEGER, shortName INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, globalPid INTEGER);
        """)
        names = {name: i for i, name in enumerate({k[1] for k in kernels})}
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, n) for n, i in names.items()])
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?)",
                       [(s, e, pid << 24, names[n]) for pid, n, s, e in kernels])
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, ?)",
                       [(s, e, pid << 24) for pid, s, e in copies])
    db.commit()
    db.close()
    return path


def summarize_export(path):
    result = run_report(path)
    assert result.returncode == 0, result.stderr
    return json.loads(path.with_name(path.stem + ".summary.json").read_text())


MS = 1_000_000


def one_epoch(pid, start=0):
    return [(pid, "epoch 0", start, start + 1000 * MS), (pid, "batch 0", start, start + 1000 * MS),
            (pid, "forward", start + 100 * MS, start + 600 * MS)]


def test_gpu_report_gives_kernel_time_idle_and_nccl_share(tmp_path):
    export = fake_export(tmp_path / "gpu.sqlite", one_epoch(7),
                         kernels=[(7, "sgemm", 100 * MS, 400 * MS), (7, "ncclKernel_AllReduce", 300 * MS, 600 * MS)],
                         copies=[(7, 0, 50 * MS)])
    summary = summarize_export(export)
    gpu = summary["ranks"][0]["gpu"]
    assert gpu["kernel_time_s"] == pytest.approx(0.6)
    assert gpu["idle_share"] == pytest.approx(1 - 0.55)  # copy 0-50 ms, kernels 100-600 ms overlap
    assert gpu["nccl_share"] == pytest.approx(0.5) and gpu["nccl_time_s"] == pytest.approx(0.3)
    assert "gpu idle 45.0 %, nccl 50.0 %" in summary["one_line"]


def test_ranks_follow_the_marks_not_the_pids(tmp_path):
    nvtx = one_epoch(5) + one_epoch(9) + [(5, "rank 1", 0, None), (9, "rank 0", 0, None)]
    summary = summarize_export(fake_export(tmp_path / "marks.sqlite", nvtx))
    assert [(r["rank"], r["pid"]) for r in summary["ranks"]] == [(0, 9), (1, 5)]


def test_ranks_fall_back_to_pid_order_without_marks(tmp_path):
    summary = summarize_export(fake_export(tmp_path / "nomarks.sqlite", one_epoch(9) + one_epoch(5)))
    assert summary["rank_source"] == "pid order"
    assert [(r["rank"], r["pid"]) for r in summary["ranks"]] == [(0, 5), (1, 9)]


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("report: "), result.stderr
    assert all(f in lines[0] for f in fragments), lines[0]


def test_missing_report_is_one_line_naming_launch(tmp_path):
    assert_one_line_error(run_report(tmp_path / "absent.nsys-rep"), "does not exist", "scripts/launch.sh")


def test_wrong_file_type_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_line_error(run_report(tmp_path / "notes.txt"), "not an Nsight Systems report", ".nsys-rep")


def test_corrupt_report_is_one_line(tmp_path):
    require_nsys()
    (tmp_path / "corrupt.nsys-rep").write_bytes(b"not a report")
    assert_one_line_error(run_report(tmp_path / "corrupt.nsys-rep"), "nsys could not read")


def test_missing_nsys_is_one_line_naming_the_installer(tmp_path):
    (tmp_path / "any.nsys-rep").write_bytes(b"x")
    env = {**os.environ, "PATH": path_without_nsys(tmp_path)}
    assert_one_line_error(run_report(tmp_path / "any.nsys-rep", env=env), "nsys is not on PATH",
                          "scripts/install_nsys.sh")


def test_export_without_training_ranges_is_one_line(tmp_path):
    export = fake_export(tmp_path / "empty.sqlite", [(3, "something else", 0, 10)])
    assert_one_line_error(run_report(export), "no 'epoch N' NVTX ranges")


def test_non_sqlite_export_is_one_line(tmp_path):
    (tmp_path / "bogus.sqlite").write_text("plain text")
    assert_one_line_error(run_report(tmp_path / "bogus.sqlite"), "not an nsys SQLite export")


def test_missing_metrics_is_one_line(tmp_path):
    export = fake_export(tmp_path / "m.sqlite", one_epoch(3))
    assert_one_line_error(run_report(export, "--metrics", tmp_path / "none.json"), "metrics file", "does not exist")


def test_missing_nsys_skips_locally_but_fails_under_ci(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require_nsys()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        require_nsys()


# ---- the reader's edge cases, in-process on tiny SQLite files: older nsys exports (no
# StringIds, no TARGET_INFO_CUDA_DEVICE columns), metrics in bytes/s, empty inputs, a metrics
# file that is not JSON. Each costs milliseconds; a real capture would not produce them here.
def sqlite_file(path, *statements):
    with closing(sqlite3.connect(path)) as db:
        for sql in statements:
            db.execute(sql)
        db.commit()
    return path


def test_an_export_without_nvtx_ranges_names_the_trace_option(tmp_path):
    path = sqlite_file(tmp_path / "cpu.sqlite", "CREATE TABLE StringIds(id, value)", "CREATE TABLE OSRT_API(start)")
    with pytest.raises(UserError, match="has no NVTX ranges; profile with --trace including nvtx"):
        trace.load_trace(path)


def test_an_sqlite_file_without_any_nsys_table_is_named_not_an_nsys_export(tmp_path):
    path = sqlite_file(tmp_path / "cpu.sqlite", "CREATE TABLE OTHER(x)")
    with pytest.raises(UserError, match=r"is an SQLite database but not an nsys export \(.*it holds OTHER\)"):
        trace.load_trace(path)


def test_an_export_with_inline_text_only_reads_the_ranges_without_stringids(tmp_path):
    path = sqlite_file(tmp_path / "old.sqlite", "CREATE TABLE NVTX_EVENTS(start, end, text, globalTid)")
    with closing(sqlite3.connect(path)) as db:
        query = trace._nvtx_query(db, {"NVTX_EVENTS"})
        assert "StringIds" not in query and "e.text" in query
        assert db.execute(query).fetchall() == []


def test_a_cuda_device_table_without_its_columns_means_no_device_map(tmp_path):
    path = sqlite_file(tmp_path / "dev.sqlite", "CREATE TABLE TARGET_INFO_CUDA_DEVICE(gpuId, pid)")
    with closing(sqlite3.connect(path)) as db:
        assert trace._cuda_devices(db, {"TARGET_INFO_CUDA_DEVICE"}) is None


def test_a_bytes_per_second_metric_is_reported_in_megabytes_per_second(tmp_path):
    name = "PCIe RX Throughput [bytes/s]"
    assert gpu_metrics.metric_key(name) == "pcie_rx_bps"
    path = sqlite_file(
        tmp_path / "metrics.sqlite",
        "CREATE TABLE TARGET_INFO_GPU_METRICS(typeId, metricId, metricName)",
        "CREATE TABLE GPU_METRICS(timestamp, typeId, metricId, value)",
        f"INSERT INTO TARGET_INFO_GPU_METRICS VALUES (257, 3, '{name}')",
        "INSERT INTO GPU_METRICS VALUES (10, 257, 3, 2500000)")
    with closing(sqlite3.connect(path)) as db:
        source = gpu_metrics.find_source(path, db, {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"})
    assert source is not None
    (chunk,) = gpu_metrics_read.chunks(source)
    assert (chunk.time.tolist(), chunk.gpu.tolist(), chunk.value.tolist()) == ([10], [1], [2.5])
    assert [gpu_metrics.KEYS[k] for k in chunk.key.tolist()] == ["pcie_rx_mbps"]


def test_no_samples_and_no_pieces_give_no_summary_and_empty_helpers_stay_empty():
    assert gpu_metrics_summary.placed(SimpleNamespace(metrics=None)) is None
    assert bubble._gpu_view([], [], None) is None
    assert stats.percentile([], 50) is None
    assert stats.merge([(5, 5), (1, 3), (2, 4), (7, 6)]) == [(1, 4)]  # empty and reversed ones drop


def test_a_metrics_file_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(UserError, match="is not text .*; pass the metrics JSON the run wrote"):
        load_metrics(path)
