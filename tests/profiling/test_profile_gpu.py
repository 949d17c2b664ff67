"""The GPU side of the profile report on real nsys exports (2022.2 and 2026.2) and hand-built tables.

The real exports (tests/data/nsys) hold real kernels, copies, runtime calls and correlation
ids; with_training_ranges adds our NVTX ranges to a copy. Every expected number here is
computed another way than handler/profiling does it: SQL joins and a 100 ns bitmap.
"""
import json
import sqlite3
import subprocess
import sys

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.gpu_metrics import metric_key
from handler.profiling.gpu_view import PhaseLookup
from handler.profiling.render import one_line
from handler.profiling.trace import Range, load_trace
from tests.nsys_helpers import PHASE_SPLIT, REAL_EXPORTS, REPO, with_training_ranges

PID = "(%s >> 24) & 16777215"
TICK = 100  # ns per bitmap cell


@pytest.fixture(scope="module", params=sorted(REAL_EXPORTS))
def real(request, tmp_path_factory):
    """(version, export with our ranges, layout, summary); 2022.2 keeps its text in StringIds."""
    version = request.param
    export = tmp_path_factory.mktemp("real") / f"nsys{version}.sqlite"
    layout = with_training_ranges(REAL_EXPORTS[version], export, string_ids=version == "2022.2")
    return version, export, layout, summarize(load_trace(export))


def rank_of(summary, pid):
    return next(r for r in summary["ranks"] if r["pid"] == pid)


def activity_rows(db, pid):
    """(start, end, device, kernel name or None) of every kernel, copy and memset of pid."""
    rows = db.execute(f"SELECT k.start, k.end, k.deviceId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                      f"JOIN StringIds s ON s.id = k.shortName WHERE {PID % 'k.globalPid'} = ?", (pid,)).fetchall()
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        rows += db.execute(f"SELECT start, end, deviceId, NULL FROM {table} WHERE {PID % 'globalPid'} = ?",
                           (pid,)).fetchall()
    return rows


class Bitmap:
    """A span of time in TICK-ns cells; set() marks intervals, count() counts marked cells."""

    def __init__(self, start, end):
        self.start, self.cells = start, bytearray((end - start) // TICK + 1)

    def set(self, start, end):
        a, b = max(0, (start - self.start) // TICK), max(0, (end - self.start) // TICK)
        self.cells[a:b] = b"\x01" * (len(self.cells[a:b]))

    def seconds(self, mask=None):
        if mask is None:
            return self.cells.count(1) * TICK / 1e9
        both = int.from_bytes(self.cells, "little") & int.from_bytes(mask.cells, "little")
        return both.to_bytes(len(self.cells), "little").count(1) * TICK / 1e9


def test_gpu_time_per_phase_matches_an_sql_join_through_correlation_ids(real):
    version, export, layout, summary = real
    db = sqlite3.connect(export)
    for pid in layout:
        expected = {}
        for name, _ in PHASE_SPLIT:
            total = 0
            for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
                # Our phase ranges sit only on the main thread, so every launch of the process
                # (main or helper thread) belongs to the phase open there at the call's start.
                # A correlation id can repeat (runtime call and the driver call inside it): the first counts.
                total += db.execute(f"""
                    WITH r AS MATERIALIZED (SELECT correlationId, {PID % 'globalTid'} AS pid, MIN(start) AS start
                                            FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1, 2),
                         p AS MATERIALIZED (SELECT e.start, e.end, {PID % 'e.globalTid'} AS pid FROM NVTX_EVENTS e
                                            LEFT JOIN StringIds s ON s.id = e.textId
                                            WHERE COALESCE(e.text, s.value) = ?)
                    SELECT COALESCE(SUM(a.end - a.start), 0) FROM {table} a
                    JOIN r ON r.correlationId = a.correlationId AND r.pid = {PID % 'a.globalPid'}
                    JOIN p ON p.pid = r.pid AND p.start <= r.start AND r.start < p.end
                    WHERE {PID % 'a.globalPid'} = ?""", (name, pid)).fetchone()[0]
            expected[name] = total / 1e9
        expected["data_gpu"] = 0.0  # no DALI thread or kernel in these runs: nothing is input-pipeline work
        got = rank_of(summary, pid)["gpu"]["phase_kernel_s"]
        assert got == pytest.approx(expected, abs=1e-9), version
        assert got["forward"] > 0 and got["backward"] > 0 and got["optimizer"] > 0
        gpu = rank_of(summary, pid)["gpu"]
        assert sum(got.values()) + gpu["unattributed_s"] == pytest.approx(gpu["activity_s"])


def test_gpu_idle_and_data_stall_match_a_bitmap_of_the_epoch(real):
    version, export, layout, summary = real
    db = sqlite3.connect(export)
    for pid, entry in layout.items():
        start, end = entry["epoch"]
        busy = Bitmap(start, end)
        for a, b, _, _ in activity_rows(db, pid):
            busy.set(max(a, start), min(b, end))
        data = Bitmap(start, end)
        for name, a, b in entry["phases"]:
            if name == "data":
                data.set(a, b)
        epoch_s = (end - start) / 1e9
        gpu = rank_of(summary, pid)["gpu"]
        assert gpu["idle_share"] == pytest.approx(1 - busy.seconds() / epoch_s, abs=2e-3), version
        stalled = data.seconds() - data.seconds(busy)
        assert gpu["data_stall_share"] == pytest.approx(stalled / epoch_s, abs=2e-3), version
        assert 0 < gpu["data_stall_share"] <= gpu["idle_share"]


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    export = tmp_path_factory.mktemp("nccl") / "two_gpus.sqlite"
    layout = with_training_ranges(REAL_EXPORTS["2026.2"], export)
    return export, layout, summarize(load_trace(export))


def test_nccl_kernels_give_comm_seconds_and_their_overlap_with_compute(two_gpus):
    export, layout, summary = two_gpus
    db = sqlite3.connect(export)
    for pid, entry in layout.items():
        start, end = entry["epoch"]
        nccl, compute = Bitmap(start, end), Bitmap(start, end)
        for a, b, _, name in activity_rows(db, pid):
            if name is not None:
                (nccl if "nccl" in name.lower() else compute).set(max(a, start), min(b, end))
        comm = rank_of(summary, pid)["comm"]
        assert comm["source"] == "nccl kernels"
        assert comm["seconds"] == pytest.approx(nccl.seconds(), abs=2e-5) and comm["seconds"] > 0
        overlapped = nccl.seconds(compute)
        assert comm["exposed_s"] == pytest.approx(nccl.seconds() - overlapped, abs=2e-5)
        assert comm["overlap_share"] == pytest.approx(overlapped / nccl.seconds(), abs=2e-3)


def test_stragglers_compare_each_steps_first_all_reduce_across_ranks(two_gpus):
    export, layout, summary = two_gpus
    db = sqlite3.connect(export)
    firsts = {}
    for pid, entry in layout.items():
        starts = sorted(a for a, _, _, name in activity_rows(db, pid) if name and "nccl" in name.lower())
        firsts[entry["rank"]] = [min((s for s in starts if b0 <= s < b1), default=None) for b0, b1 in entry["batches"]]
    steps = [i for i in range(len(firsts[0])) if all(f[i] is not None for f in firsts.values())]
    spreads = sorted((max(f[i] for f in firsts.values()) - min(f[i] for f in firsts.values())) / 1e6 for i in steps)
    last = [max(firsts, key=lambda r: firsts[r][i]) for i in steps]
    table = summary["stragglers"]
    assert table["steps"] == len(steps) >= 3
    assert table["max_ms"] == pytest.approx(spreads[-1])
    assert spreads[0] <= table["p50_ms"] <= table["p95_ms"] <= spreads[-1]
    assert table["last_rank_counts"] == {str(r): last.count(r) for r in firsts}


def test_one_line_summary_uses_the_gpu_view_on_gpu_runs(real):
    version, _, _, summary = real
    line = one_line(summary)
    overall = summary["overall"]
    assert line.endswith("[GPU time]")
    assert f"data-stall {overall['gpu_data_stall_share'] * 100:.1f} %" in line
    assert f"backward {overall['gpu_phase_shares']['backward'] * 100:.1f} %" in line
    # CPU-side phase shares stay in the JSON, unchanged in meaning.
    assert overall["phase_shares"]["backward"] == pytest.approx(0.40, abs=0.001)


def shuffled_copy(source, target):
    """The same export with every table's rows in reverse order (nsys 2025.6 stopped ordering them)."""
    db = sqlite3.connect(source)
    db.execute(f"ATTACH DATABASE '{target}' AS shuffled")
    for (name, sql) in db.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall():
        db.execute(sql.replace(f"CREATE TABLE {name}", f"CREATE TABLE shuffled.{name}", 1)
                   .replace(f'CREATE TABLE "{name}"', f"CREATE TABLE shuffled.{name}", 1))
        db.execute(f"INSERT INTO shuffled.{name} SELECT * FROM main.{name} ORDER BY rowid DESC")
    db.commit()
    db.close()


def test_row_order_in_the_export_does_not_change_the_summary(real, tmp_path):
    version, export, _, summary = real
    shuffled_copy(export, tmp_path / "shuffled.sqlite")
    assert summarize(load_trace(tmp_path / "shuffled.sqlite")) == summary


def test_export_without_runtime_rows_keeps_kernel_time_but_attributes_nothing(real, tmp_path):
    version, export, _, summary = real
    copy = tmp_path / "no_runtime.sqlite"
    copy.write_bytes(export.read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    gpu = summarize(load_trace(copy))["ranks"][0]["gpu"]
    assert gpu["kernel_time_s"] == summary["ranks"][0]["gpu"]["kernel_time_s"]
    assert set(gpu["phase_kernel_s"].values()) == {0.0} and gpu["unattributed_s"] == pytest.approx(gpu["activity_s"])


def test_innermost_open_phase_wins_and_closed_ones_do_not_count():
    tid = 7
    lookup = PhaseLookup([Range("data", 0, 100, tid), Range("h2d", 40, 60, tid), Range("forward", 100, 200, tid)])
    assert [lookup.phase(tid, t) for t in (10, 50, 60, 99, 100, 250)] == \
        ["data", "h2d", "data", "data", "forward", None]
    assert lookup.phase(8, 50) is None


def test_report_page_shows_gpu_phases_communication_and_stragglers(two_gpus, tmp_path):
    export = two_gpus[0]
    result = subprocess.run([sys.executable, "-m", "handler.profiling.report", str(export), "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for heading in ("## GPU time per phase (s)", "## Communication", "## Stragglers"):
        assert heading in result.stdout
    saved = json.loads((tmp_path / f"{export.stem}.summary.json").read_text())
    assert saved["one_line"].endswith("[GPU time]") and saved["stragglers"]["steps"] >= 3


# GPU metrics: a hand-built table in the documented layout (TARGET_INFO_GPU_METRICS + GPU_METRICS).
MS = 1_000_000
METRIC_NAMES = {1: "SMs Active [Throughput %]", 2: "SM Issue [Throughput %]",
                3: "Compute Warps in Flight [Throughput %]", 4: "DRAM Read Bandwidth [Throughput %]",
                5: "DRAM Write Bandwidth [Throughput %]", 6: "PCIe RX Throughput [MB/s]",
                7: "PCIe TX Throughput [MB/s]", 8: "GR Active [Throughput %]"}


# The tables every hand-built export below starts from.
BASE_TABLES = """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, textId INTEGER, globalTid INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
                                                 globalPid INTEGER, shortName INTEGER, correlationId INTEGER);
"""


def metrics_export(path, samples):
    """One rank (pid 5) with one epoch 0-1000 ms and a kernel on GPU 1; samples: (t_ms, metricId, value)."""
    db = sqlite3.connect(path)
    db.executescript(BASE_TABLES + """
        CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
                                              metricId INTEGER, metricName TEXT);
        CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER);
    """)
    tid = 5 << 24 | 5
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)",
                   [(0, 1000 * MS, "epoch 0", tid), (0, 1000 * MS, "batch 0", tid)])
    db.execute("INSERT INTO StringIds VALUES (1, 'sgemm')")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 1, ?, 1, 11)", (0, 500 * MS, 5 << 24))
    type_id = 0x10000 | 1  # GPU 1 in the low byte
    db.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GA100', ?, ?)",
                   [(type_id, i, name) for i, name in METRIC_NAMES.items()])
    db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)", [(t * MS, type_id, m, v) for t, m, v in samples])
    db.commit()
    db.close()
    return path


def test_gpu_metrics_give_mean_and_p95_per_gpu_inside_training_epochs(tmp_path):
    sm = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    samples = [(100 * i, 1, v) for i, v in enumerate(sm)]
    samples += [(100 * i, 4, 10) for i in range(10)] + [(100 * i, 5, 5) for i in range(10)]
    samples += [(100 * i, 6, 1000 + i) for i in range(10)] + [(100 * i, 7, 2000) for i in range(10)]
    samples += [(1500, 1, 0), (2000, 6, 0)]  # after the epoch: not training
    samples += [(100 * i, 8, 99) for i in range(10)]  # a metric we do not report
    summary = summarize(load_trace(metrics_export(tmp_path / "m.sqlite", samples)))
    gpu1 = summary["ranks"][0]["gpu_metrics"]["1"]
    assert gpu1["sm_active_pct"]["mean"] == pytest.approx(55)
    assert gpu1["sm_active_pct"]["p95"] == pytest.approx(95.5)  # numpy's linear interpolation
    assert gpu1["sm_active_pct"]["samples"] == 10
    assert gpu1["dram_bw_pct"]["mean"] == pytest.approx(15)  # read + write at the same instants
    assert gpu1["pcie_rx_mbps"]["mean"] == pytest.approx(1004.5)
    assert gpu1["pcie_tx_mbps"]["p95"] == pytest.approx(2000)
    assert "sm_issue_pct" not in gpu1  # listed but never sampled
    assert not any(key.startswith("gr_") for key in gpu1)


def test_report_without_gpu_metrics_says_null_not_zero(tmp_path):
    summary = summarize(load_trace(metrics_export(tmp_path / "none.sqlite", [])))
    assert summary["ranks"][0]["gpu_metrics"] is None


@pytest.mark.parametrize("name, key", [
    ("SMs Active [Throughput %]", "sm_active_pct"), ("SM Active", "sm_active_pct"),
    ("SM Issue [Throughput %]", "sm_issue_pct"), ("Compute Warps in Flight [Throughput %]", "warps_in_flight_pct"),
    ("DRAM Bandwidth [Throughput %]", "dram_bw_pct"), ("PCIe TX Throughput [Throughput %]", "pcie_tx_pct"),
    ("PCIe Read Bandwidth [MB/s]", "pcie_rx_mbps"), ("NVLink RX Bandwidth [Throughput %]", None),
    ("Compute Warps In Flight [Throughput %]", "warps_in_flight_pct"), ("Pixel Warps in Flight [Throughput %]", None)])
def test_metric_names_of_different_nsys_releases_map_to_one_key(name, key):
    assert metric_key(name) == key


def test_launch_from_a_thread_without_ranges_takes_the_training_threads_phase(tmp_path):
    """An autograd device thread or a helper thread opens no ranges; its launches follow the training thread."""
    path = tmp_path / "threads.sqlite"
    db = sqlite3.connect(path)
    db.executescript(BASE_TABLES + """
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER);
        INSERT INTO StringIds VALUES (1, 'k');
    """)
    main, helper, loader = 5 << 24 | 5, 5 << 24 | 6, 5 << 24 | 7
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)", [
        (0, 1000 * MS, "epoch 0", main), (0, 1000 * MS, "batch 0", main), (0, 100 * MS, "data", main),
        (100 * MS, 400 * MS, "forward", main), (400 * MS, 900 * MS, "backward", main),
        (500 * MS, 600 * MS, "h2d", loader)])  # a loader thread copying while backward runs
    # (launch start, thread, kernel start, kernel end); kernels run later than their launch.
    launches = [(150 * MS, main, 300 * MS, 450 * MS), (450 * MS, helper, 460 * MS, 700 * MS),
                (550 * MS, loader, 700 * MS, 720 * MS), (950 * MS, main, 950 * MS, 960 * MS)]
    for corr, (launch, tid, start, end) in enumerate(launches):
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (launch, launch + 10, tid, corr))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, 1, ?)", (start, end, 5 << 24, corr))
    db.commit()
    db.close()
    gpu = summarize(load_trace(path))["ranks"][0]["gpu"]
    # The loader thread's own open range wins over the training thread's backward.
    assert gpu["phase_kernel_s"] == pytest.approx({"data": 0, "h2d": 0.02, "forward": 0.15, "backward": 0.24,
                                                   "optimizer": 0, "data_gpu": 0})
    assert gpu["unattributed_s"] == pytest.approx(0.01)  # launched at 950 ms, when no phase was open
