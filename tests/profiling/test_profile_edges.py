"""The profile reader's edge cases, in-process on tiny SQLite files: older nsys exports
(no StringIds, no TARGET_INFO_CUDA_DEVICE columns), metrics in bytes/s, empty inputs and
unreadable files. Each costs milliseconds; a real nsys capture would not produce them here."""
import sqlite3
from contextlib import closing

import pytest

from handler.profiling import bubble, gpu_metrics, stats, trace
from handler.profiling.report import load_metrics
from handler.runtime.errors import UserError


def sqlite_file(path, *statements):
    with closing(sqlite3.connect(path)) as db:
        for sql in statements:
            db.execute(sql)
        db.commit()
    return path


def test_an_export_without_nvtx_ranges_names_the_trace_option(tmp_path):
    path = sqlite_file(tmp_path / "cpu.sqlite", "CREATE TABLE OTHER(x)")
    with pytest.raises(UserError, match="has no NVTX ranges; profile with --trace including nvtx"):
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
        samples = gpu_metrics.load_metric_samples(db, {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"})
    assert samples == (gpu_metrics.MetricSample(1, 10, "pcie_rx_mbps", 2.5),)


def test_no_samples_and_no_pieces_give_no_summary_and_empty_helpers_stay_empty():
    assert gpu_metrics.summarize_metrics(None, [0], [(0, 10)]) is None
    assert bubble._gpu_view([], [], None) is None
    assert stats.percentile([], 50) is None
    assert stats.merge([(5, 5), (1, 3), (2, 4), (7, 6)]) == [(1, 4)]  # empty and reversed ones drop


def test_a_metrics_file_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(UserError, match="is not JSON .*; pass the run's metrics JSON"):
        load_metrics(path)
