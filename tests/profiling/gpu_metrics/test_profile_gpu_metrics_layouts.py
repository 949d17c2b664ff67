"""GPU metrics from both export layouts, on generated tables: the 2023+ GPU_METRICS rows and the 2022.x
GENERIC_EVENTS JSON, each sample placed on its GPU, epoch and phase; what cannot be placed is counted."""
import json
import sqlite3
from contextlib import closing

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from handler.profiling.gpu_metrics import read as gpu_metrics_read
from handler.profiling.analysis import summarize
from handler.profiling.gpu_metrics import metric_key
from handler.profiling.render import markdown
from handler.profiling.trace import load_trace

MS = 1_000_000
PID = 5
NAMES_2023 = {0: "SMs Active [Throughput %]", 1: "DRAM Read Bandwidth [Throughput %]",
              2: "DRAM Write Bandwidth [Throughput %]", 3: "PCIe TX Throughput [Throughput %]",
              4: "PCIe RX Throughput [Throughput %]", 5: "NVLink RX Bandwidth [Throughput %]"}
NAMES_2022 = ("SM Active", "DRAM Read Throughput", "DRAM Write Throughput", "PCIe TX Throughput", "PCIe RX Throughput",
              "SYS Clock Frequency")
KEYS = ("sm_active_pct", "dram_read_pct", "dram_write_pct", "pcie_tx_pct", "pcie_rx_pct", None)
# one epoch of two 100-ms steps; each: data 0-20 (h2d 10-20 inside), forward 20-50, backward 50-90
RANGES = [("epoch 0", 0, 200)] + [r for b in (0, 100) for r in (
    (f"batch {b // 100}", b, b + 100), ("data", b, b + 20), ("h2d", b + 10, b + 20), ("forward", b + 20, b + 50),
    ("backward", b + 50, b + 90))]


def type_id(gpu: int) -> int:
    return (1 << 48) | (1 << 32) | gpu


def export(path, layout: str, samples, ranges=RANGES, devices=(0,), names=None):
    """One rank (pid 5) with the ranges (ms) and a kernel on each CUDA device; samples:
    (t_ms, gpu, metric index, value), the metric indexes those of NAMES_2023 / NAMES_2022."""
    tid = PID << 24 | PID
    with closing(sqlite3.connect(path)) as db:
        db.executescript("""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, textId INTEGER, globalTid INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, globalPid INTEGER,
                                                     shortName INTEGER, correlationId INTEGER);
            INSERT INTO StringIds VALUES (1, 'sgemm');""")
        db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)",
                       [(int(a * MS), int(b * MS), name, tid) for name, a, b in ranges])
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, 1, ?)",
                       [(0, MS, d, PID << 24, d) for d in devices])
        gpus = sorted({g for _, g, _, _ in samples} | set(devices))
        if layout == "GPU_METRICS":
            db.executescript("""CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
                                    metricId INTEGER, metricName TEXT);
                                CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER,
                                    value INTEGER);""")
            db.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GA100', ?, ?)",
                           [(type_id(g), i, n) for g in gpus for i, n in (names or NAMES_2023).items()])
            db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)",
                           [(int(t * MS), type_id(g), m, v) for t, g, m, v in samples])
        else:
            db.executescript("""CREATE TABLE GENERIC_EVENT_SOURCES (sourceId INTEGER, data TEXT);
                                CREATE TABLE GENERIC_EVENT_TYPES (typeId INTEGER, sourceId INTEGER, data TEXT);
                                CREATE TABLE GENERIC_EVENTS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER,
                                    data TEXT);""")
            db.execute("INSERT INTO GENERIC_EVENT_SOURCES VALUES (9, ?)",
                       (json.dumps({"Name": "GpuMetrics", "TimeSource": "SessionNs"}),))
            db.execute("INSERT INTO GENERIC_EVENT_SOURCES VALUES (8, ?)", (json.dumps({"Name": "FTrace"}),))
            db.executemany("INSERT INTO GENERIC_EVENT_TYPES VALUES (?, 9, ?)",
                           [(type_id(g), json.dumps({"Name": "", "Fields": [{"Name": n} for n in NAMES_2022]}))
                            for g in gpus])
            rows: dict = {}
            for t, g, m, v in samples:
                rows.setdefault((t, g), {})[NAMES_2022[m]] = str(v)
            db.executemany("INSERT INTO GENERIC_EVENTS VALUES (?, NULL, ?, ?)",
                           [(int(t * MS), type_id(g), json.dumps(data, indent=4)) for (t, g), data in rows.items()])
            db.execute("INSERT INTO GENERIC_EVENT_TYPES VALUES (77, 8, '{\"Name\": \"irq\"}')")
            db.execute("INSERT INTO GENERIC_EVENTS VALUES (5, 6, 77, '{\"irq\": \"3\"}')")  # FTrace's: not a metric
        db.commit()
    return path


def every_ms(gpus=(0,), until=220, value=lambda t, g, m: (t * 3 + m * 7 + g) % 101):
    return [(t, g, m, value(t, g, m)) for t in range(0, until) for g in gpus for m in range(6)]


def mean_of(samples, gpu, metric, inside):
    values = [v for t, g, m, v in samples if g == gpu and m == metric and inside(t)]
    return sum(values) / len(values)


@pytest.mark.parametrize("layout", ["GPU_METRICS", "GENERIC_EVENTS"])
def test_both_layouts_give_the_same_epoch_and_phase_means_per_gpu(tmp_path, layout):
    samples = every_ms(gpus=(0, 1), until=230)
    summary = summarize(load_trace(export(tmp_path / "m.sqlite", layout, samples, devices=(0, 1))))
    rank = summary["ranks"][0]
    for gpu in (0, 1):
        stats = rank["gpu_metrics"][str(gpu)]
        for m, key in enumerate(KEYS[:5]):
            assert stats[key]["mean"] == pytest.approx(mean_of(samples, gpu, m, lambda t: t < 200))
            assert stats[key]["samples"] == 200
        phases = rank["gpu_metrics_phases"][str(gpu)]
        assert phases["h2d"]["sm_active_pct"]["mean"] == pytest.approx(
            mean_of(samples, gpu, 0, lambda t: t < 200 and 10 <= t % 100 < 20))
        assert phases["data"]["sm_active_pct"]["samples"] == 20  # 0-10 ms of each step: h2d holds the rest
        assert phases["other"]["pcie_tx_pct"]["mean"] == pytest.approx(
            mean_of(samples, gpu, 3, lambda t: t < 200 and t % 100 >= 90))
        assert stats["dram_bw_pct"]["mean"] == pytest.approx(stats["dram_read_pct"]["mean"] + stats["dram_write_pct"]["mean"])
    unplaced = summary["gpu_metrics_unplaced"]
    assert unplaced["layout"] == layout
    assert unplaced["outside_epochs"] == 2 * 30 * 5 and unplaced["unused_gpu"] == 0
    assert unplaced["placed"] + unplaced["outside_epochs"] == unplaced["values"] == 2 * 230 * 5
    page = markdown(summary, "m")
    assert "| SM Active % | DRAM read | DRAM write | DRAM bandwidth | PCIe RX | PCIe TX |" in page
    assert "## GPU metrics per phase (means)" in page
    assert "Unplaced GPU-metric values: 300 GPU-metric values of the ranks' GPUs lie outside every epoch" in page


def test_a_gpu_no_rank_used_and_rows_no_table_names_are_counted_not_dropped(tmp_path):
    samples = every_ms(gpus=(0, 3), until=200)
    path = export(tmp_path / "m.sqlite", "GPU_METRICS", samples)
    with closing(sqlite3.connect(path)) as db:
        db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, 0, 50)", [(t * MS, type_id(7), ) for t in range(10)])
        db.commit()
    summary = summarize(load_trace(path))
    unplaced = summary["gpu_metrics_unplaced"]
    assert unplaced["unused_gpu"] == 200 * 5 and unplaced["unknown_source"] == 10
    assert list(summary["ranks"][0]["gpu_metrics"]) == ["0"]
    assert any("GPUs no rank used (GPUs sampled: 0, 3; used: 0)" in line for line in unplaced["lines"])
    assert any(line.startswith("10 GPU-metric values of a source this report does not know") for line in unplaced["lines"])
    assert unplaced["not_reported"] == ["NVLink RX Bandwidth [Throughput %]"]


def test_pcie_overlap_is_the_share_of_tx_busy_samples_when_rx_is_busy_too(tmp_path):
    def value(t, g, m):  # TX busy every ms of the first 100 ms; RX busy in the first 25 of them
        return {3: 40 if t < 100 else 1, 4: 30 if t < 25 else 2}.get(m, 0)
    summary = summarize(load_trace(export(tmp_path / "m.sqlite", "GPU_METRICS", every_ms(value=value))))
    overlap = summary["ranks"][0]["pcie_overlap"]["0"]
    assert overlap == {"tx_busy_samples": 100, "both_busy_samples": 25, "share": 0.25, "busy_at": ">= 5 %"}


def test_read_and_write_split_across_chunks_still_add_up_to_dram_bandwidth(tmp_path, monkeypatch):
    samples = every_ms(until=200)
    path = export(tmp_path / "m.sqlite", "GPU_METRICS", samples)
    whole = summarize(load_trace(path))["ranks"][0]
    monkeypatch.setattr(gpu_metrics_read, "GPU_METRICS_CHUNK", 50)  # 50 rows: instants of six rows split at edges
    split = summarize(load_trace(path))["ranks"][0]
    assert split["gpu_metrics"] == whole["gpu_metrics"] and split["pcie_overlap"] == whole["pcie_overlap"]
    bw = split["gpu_metrics"]["0"]["dram_bw_pct"]
    sums = sorted(mean_of(samples, 0, 1, lambda x: x == t) + mean_of(samples, 0, 2, lambda x: x == t) for t in range(200))
    assert bw["samples"] == 200 and bw["p95"] == pytest.approx(np.percentile(sums, 95))


@pytest.mark.parametrize("name, key", [
    ("SM Active", "sm_active_pct"), ("SMs Active [Throughput %]", "sm_active_pct"),
    ("PCIe TX Throughput", "pcie_tx_pct"), ("PCIe RX Throughput [Throughput %]", "pcie_rx_pct"),
    ("DRAM Read Throughput", "dram_read_pct"), ("DRAM Write Bandwidth [Throughput %]", "dram_write_pct"),
    ("VRAM Bandwidth", "dram_bw_pct"), ("PCIe Read Throughput [MB/s]", "pcie_rx_mbps"),
    ("GR Active", "gpu_active_pct"), ("SYS Clock Frequency", None), ("NVLink TX Responses User Data", None)])
def test_names_with_and_without_the_unit_bracket(name, key):
    assert metric_key(name) == key


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(0, 100), min_size=40, max_size=40),
       cut=st.integers(5, 60), layout=st.sampled_from(["GPU_METRICS", "GENERIC_EVENTS"]))
def test_phase_means_lie_within_the_samples_and_placed_plus_unplaced_is_all(tmp_path_factory, values, cut, layout):
    ranges = [("epoch 0", 0, 30), ("batch 0", 0, 30), ("data", 0, cut / 2), ("forward", cut / 2, 30)]
    samples = [(t * 2, g, m, values[(t + m) % 40]) for t in range(40) for g in (0, 1) for m in range(5)]
    path = export(tmp_path_factory.mktemp("p") / "m.sqlite", layout, samples, ranges=ranges)
    summary = summarize(load_trace(path))
    inside = [v for t, g, m, v in samples if g == 0 and m == 0 and t < 30]
    for region in summary["ranks"][0]["gpu_metrics_phases"]["0"].values():
        assert min(inside) - 1e-9 <= region["sm_active_pct"]["mean"] <= max(inside) + 1e-9
        assert min(inside) <= region["sm_active_pct"]["p95"] <= max(inside)
    epoch = summary["ranks"][0]["gpu_metrics"]["0"]["sm_active_pct"]
    assert epoch["mean"] == pytest.approx(np.mean(inside)) and epoch["p95"] == pytest.approx(np.percentile(inside, 95))
    unplaced = summary["gpu_metrics_unplaced"]
    assert unplaced["placed"] + unplaced["unused_gpu"] + unplaced["outside_epochs"] + unplaced["unknown_source"] \
        == unplaced["values"] == len(samples)
    assert unplaced["unused_gpu"] == len(samples) // 2


@pytest.mark.slow  # 9-18 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_the_scale_bench_summarises_both_layouts_alike_at_tiny_size(tmp_path):
    """bench.gpu_metrics_scale --quick: both layouts generated in SQL, summarised in a child process,
    the same means from both, every value placed, and a second run reuses the cached exports."""
    import subprocess
    import sys

    from tests.nsys_helpers import REPO
    command = [sys.executable, "-m", "bench.gpu_metrics_scale", "--quick", "--cache", str(tmp_path / "cache"),
               "--json", str(tmp_path / "out.json")]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())
    gpu_metrics, generic = result["layouts"]
    assert (gpu_metrics["layout"], generic["layout"]) == ("GPU_METRICS", "GENERIC_EVENTS")
    assert gpu_metrics["rows"] == 2 * 3000 * 12 and generic["rows"] == 2 * 3000
    from bench.gpu_metrics_scale import export as cached
    assert cached(tmp_path / "cache", "GENERIC_EVENTS", 2, 3000, 12)[1] == 0.0  # made once, kept by its parameters
    assert gpu_metrics["gpus"] == generic["gpus"] == ["0", "1"]
    assert gpu_metrics["sm_active"] == pytest.approx(generic["sm_active"])
    for layout in (gpu_metrics, generic):
        assert layout["unplaced"]["placed"] == layout["unplaced"]["values"] > 0 and layout["peak_mb"] > 0


def test_a_json_value_that_is_not_a_number_is_one_line_naming_the_export(tmp_path):
    from handler.runtime.errors import UserError
    path = export(tmp_path / "m.sqlite", "GENERIC_EVENTS", every_ms(until=50))
    with closing(sqlite3.connect(path)) as db:
        db.execute("""UPDATE GENERIC_EVENTS SET data = '{"SM Active": "busy", "DRAM Read Throughput": ""}'
                      WHERE rowid = 3""")
        db.commit()
    with pytest.raises(UserError, match=r"m\.sqlite: a GPU-metrics value in GENERIC_EVENTS\.data is not a number"):
        summarize(load_trace(path))
    with closing(sqlite3.connect(path)) as db:  # an empty value is a missing one
        db.execute("""UPDATE GENERIC_EVENTS SET data = '{"SM Active": "", "DRAM Read Throughput": "7"}' WHERE rowid = 3""")
        db.commit()
    assert summarize(load_trace(path))["gpu_metrics_unplaced"]["values"] == 49 * 5 + 1
