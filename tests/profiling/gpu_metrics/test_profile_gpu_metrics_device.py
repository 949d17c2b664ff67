"""GPU metrics are those of the GPU a rank used: nsys keys them by its own GPU id, CUPTI's
deviceId is the process's CUDA ordinal, and TARGET_INFO_CUDA_DEVICE links them.

Neither real export has that table, so copies get it (and GPU metrics) in nsys' column layout,
with GPU ids made to differ from the CUDA ordinals as under CUDA_VISIBLE_DEVICES=2,3.
"""
import sqlite3

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.render import markdown
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS, with_training_ranges
from tests.nsys_rows import KERNEL
from tests.profiling.test_profile_gpu import MS, PID, rank_of

GPUS = 4  # the machine's GPUs, as nsys numbers them; SMs Active on GPU g reads 10 * (g + 1) %


def with_gpu_metrics(source, target, cuda_devices=None):
    """A real export with our training ranges, GPU metrics sampled on all GPUS every 1 ms over the
    epochs, and, when given, TARGET_INFO_CUDA_DEVICE rows (gpuId, cudaId, pid) in nsys' layout."""
    layout = with_training_ranges(source, target)
    db = sqlite3.connect(target)
    db.executescript("""
        CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL,
                                              typeName TEXT NOT NULL, metricId INTEGER NOT NULL,
                                              metricName TEXT NOT NULL);
        CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL,
                                  value INTEGER NOT NULL);
    """)
    first = min(e["epoch"][0] for e in layout.values())
    last = max(e["epoch"][1] for e in layout.values())
    for gpu in range(GPUS):
        type_id = 0x10000 | gpu
        db.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GH100', 1, 'SMs Active [Throughput %]')",
                   (type_id,))
        db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, 1, ?)",
                       [(t, type_id, 10 * (gpu + 1)) for t in range(first, last, MS)])
    if cuda_devices is not None:
        db.execute("CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER NOT NULL, cudaId INTEGER NOT NULL, "
                   "pid INTEGER NOT NULL, uuid TEXT NOT NULL, numMultiprocessors INTEGER NOT NULL)")
        db.executemany("INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?, '', 132)", cuda_devices)
    db.commit()
    db.close()
    return layout


def cuda_ordinals(export):
    with sqlite3.connect(export) as db:
        return dict(db.execute(f"SELECT {PID % 'globalPid'}, MIN(deviceId) FROM {KERNEL} GROUP BY 1"))


def test_gpu_metrics_follow_target_info_cuda_device_when_cuda_ids_differ_from_gpu_ids(tmp_path):
    export = tmp_path / "visible_subset.sqlite"
    ordinals = cuda_ordinals(REAL_EXPORTS["2026.2"])  # pid -> the CUDA ordinal CUPTI recorded
    # As under CUDA_VISIBLE_DEVICES=2,3: CUDA device n of each process is GPU n + 2. Another
    # process (pid 999) saw the same CUDA ordinals on GPUs 0 and 1.
    rows = [(cuda + 2, cuda, pid) for pid, cuda in ordinals.items()] + [(0, 0, 999), (1, 1, 999)]
    layout = with_gpu_metrics(REAL_EXPORTS["2026.2"], export, rows)
    summary = summarize(load_trace(export))
    assert summary["gpu_metrics_mapping"] == "TARGET_INFO_CUDA_DEVICE"
    for pid in layout:
        rank, gpu = rank_of(summary, pid), ordinals[pid] + 2
        assert rank["gpu"]["devices"] == [ordinals[pid]]
        assert rank["gpu_metrics_gpus"] == {str(ordinals[pid]): gpu}
        assert list(rank["gpu_metrics"]) == [str(gpu)]
        assert rank["gpu_metrics"][str(gpu)]["sm_active_pct"]["mean"] == pytest.approx(10 * (gpu + 1))
    page = markdown(summary, "subset")
    assert "Warning" not in page and f"| {gpu} (cuda {ordinals[pid]}) |" in page


@pytest.mark.parametrize("version", sorted(REAL_EXPORTS))
def test_export_without_target_info_cuda_device_says_gpu_ids_were_assumed(version, tmp_path):
    export = tmp_path / "old.sqlite"
    with sqlite3.connect(REAL_EXPORTS[version]) as db:  # neither real export has the table
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        assert "TARGET_INFO_CUDA_DEVICE" not in tables
    layout = with_gpu_metrics(REAL_EXPORTS[version], export)
    summary = summarize(load_trace(export))
    assert summary["gpu_metrics_mapping"].startswith("assumed: this export has no TARGET_INFO_CUDA_DEVICE")
    for pid in layout:
        cuda = rank_of(summary, pid)["gpu"]["devices"][0]
        assert list(rank_of(summary, pid)["gpu_metrics"]) == [str(cuda)]
    assert "**Warning: GPU ids assumed" in markdown(summary, "old")


def test_cuda_device_missing_from_the_table_gets_no_metrics_and_the_summary_says_so(tmp_path):
    export = tmp_path / "partial.sqlite"
    ordinals = cuda_ordinals(REAL_EXPORTS["2026.2"])
    listed, missing = sorted(ordinals)
    layout = with_gpu_metrics(REAL_EXPORTS["2026.2"], export, [(3, ordinals[listed], listed)])
    summary = summarize(load_trace(export))
    assert rank_of(summary, missing)["gpu_metrics"] == {}
    assert rank_of(summary, missing)["gpu_metrics_gpus"] == {str(ordinals[missing]): None}
    rank = layout[missing]["rank"]
    assert f"rank {rank} CUDA device {ordinals[missing]}" in summary["gpu_metrics_mapping"]
    assert "**Warning" in markdown(summary, "partial")


def test_table_listing_none_of_the_ranks_devices_still_warns_on_the_page(tmp_path):
    export = tmp_path / "empty.sqlite"
    with_gpu_metrics(REAL_EXPORTS["2026.2"], export, [])
    summary = summarize(load_trace(export))
    assert all(r["gpu_metrics"] == {} for r in summary["ranks"])
    assert summary["gpu_metrics_mapping"].startswith("TARGET_INFO_CUDA_DEVICE; it lists no GPU for rank 0")
    assert "**Warning: GPU ids TARGET_INFO_CUDA_DEVICE; it lists no GPU" in markdown(summary, "empty")
