"""GPU metrics of a real export: ../shared/nsys/aiprofiler_secondOptimization.sqlite.gz (nsys 2022.2 on an
A100, exported by 2022.4: its 76,502 samples in GENERIC_EVENTS as JSON of strings). The summary's means
inside its `Epoch 2` equal an SQL mean over the samples in that range, computed here apart; the lab
page shows them and the figure draws their lanes."""
import gzip
import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.lab.page import write_lab
from handler.profiling.trace import load_trace

SHARED = Path(__file__).resolve().parents[4] / "shared" / "nsys" / "aiprofiler_secondOptimization.sqlite.gz"
FIELDS = {"sm_active_pct": "SM Active", "dram_read_pct": "DRAM Read Throughput", "dram_write_pct": "DRAM Write Throughput",
          "pcie_rx_pct": "PCIe RX Throughput", "pcie_tx_pct": "PCIe TX Throughput"}


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is not here (the shared exports sit beside the checkout)")
    path = tmp_path_factory.mktemp("aip") / "aiprofiler_secondOptimization.sqlite"
    with gzip.open(SHARED) as packed, open(path, "wb") as out:
        shutil.copyfileobj(packed, out)
    return path


@pytest.fixture(scope="module")
def summary(export) -> dict:
    return summarize(load_trace(export))


def sql_means(export: Path) -> tuple[dict, int]:
    """Each field's mean over the GENERIC_EVENTS rows inside the `Epoch 2` NVTX range, and their count."""
    with closing(sqlite3.connect(export)) as db:
        start, end = db.execute("SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                                "WHERE COALESCE(e.text, s.value) = 'Epoch 2'").fetchone()
        columns = ", ".join(f"AVG(CAST(json_extract(data, '$.\"{name}\"') AS REAL))" for name in FIELDS.values())
        row = db.execute(f"SELECT COUNT(*), {columns} FROM GENERIC_EVENTS WHERE rawTimestamp >= ? AND rawTimestamp < ?",
                         (start, end)).fetchone()
    return dict(zip(FIELDS, row[1:])), row[0]


def test_the_means_inside_the_epoch_equal_an_sql_mean_over_its_samples(export, summary):
    expected, count = sql_means(export)
    gpu = summary["ranks"][0]["gpu_metrics"]["0"]
    assert count == 76_344  # of 76,502: the rest lie before or after the epoch
    for key, mean in expected.items():
        assert gpu[key]["mean"] == pytest.approx(mean, rel=1e-12), key
        assert gpu[key]["samples"] == count
    assert gpu["dram_bw_pct"]["mean"] == pytest.approx(expected["dram_read_pct"] + expected["dram_write_pct"])


def test_every_value_is_placed_or_counted_and_the_page_says_where(export, summary):
    unplaced = summary["gpu_metrics_unplaced"]
    assert unplaced["layout"] == "GENERIC_EVENTS" and unplaced["values"] == 76_502 * 9  # nine fields reported
    assert unplaced["placed"] == 76_344 * 9
    assert unplaced["outside_epochs"] == (76_502 - 76_344) * 9 and unplaced["unused_gpu"] == unplaced["unknown_source"] == 0
    assert "SYS Clock Frequency" in unplaced["not_reported"]
    overlap = summary["ranks"][0]["pcie_overlap"]["0"]
    assert 0 < overlap["tx_busy_samples"] < 76_344 and overlap["share"] is not None


def test_the_lab_page_shows_the_metrics_and_the_figure_their_lanes(export, tmp_path):
    page = write_lab([{"report": export, "mode": "kit", "gpus": 1}], tmp_path / "lab")
    lab = json.loads((tmp_path / "lab" / "lab.json").read_text())
    (row,) = lab["reports"]
    assert row["gpu_table"][0]["metrics"]["sm_active_pct"] == pytest.approx(
        summary_mean(export, "sm_active_pct"), rel=1e-12)
    assert "| SM Active % | DRAM read | DRAM write | DRAM bandwidth | PCIe RX | PCIe TX |" in page
    assert "PCIe RX busy during" in page and "lie outside every epoch" in page
    lanes = {(lane["gpu"], lane["lane"]): lane["series"] for lane in row["figure"]["lanes"]}
    assert lanes == {(0, "SM Active"): ["sm_active_pct"], (0, "DRAM"): ["dram_read_pct", "dram_write_pct"],
                     (0, "PCIe"): ["pcie_tx_pct", "pcie_rx_pct"]}
    assert Path(row["figure"]["file"]).stat().st_size > 10_000


def summary_mean(export: Path, key: str) -> float:
    return sql_means(export)[0][key]


UNREAD = {  # how an export is changed -> the start of the one line the report gives for its GPU-metric rows
    "no GENERIC_EVENT_SOURCES": ("DROP TABLE GENERIC_EVENT_SOURCES",
                                 "its GENERIC_EVENTS table holds rows but the export has no GENERIC_EVENT_SOURCES"),
    "no GENERIC_EVENT_TYPES": ("DROP TABLE GENERIC_EVENT_TYPES",
                               "its GENERIC_EVENTS table holds rows but the export has no GENERIC_EVENT_TYPES"),
    "no sample": ("DELETE FROM GENERIC_EVENTS", "the GpuMetrics sampler is named but GENERIC_EVENTS holds no sample"),
    "fields of other names": ("UPDATE GENERIC_EVENT_TYPES SET data = '{\"Fields\": [{\"Name\": \"Fan Speed\"}]}'",
                              "none of the 1 metrics the GpuMetrics sampler recorded is one the report reads (Fan Speed"),
    "GPU_METRICS without its names": ("CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, "
                                      "value INTEGER); INSERT INTO GPU_METRICS VALUES (1, 0, 0, 5); DROP TABLE GENERIC_EVENTS",
                                      "its GPU_METRICS table holds samples but no TARGET_INFO_GPU_METRICS table"),
}


@pytest.mark.parametrize("change", UNREAD, ids=list(UNREAD))
def test_gpu_metric_rows_the_report_cannot_read_are_named_in_one_line_never_silent(export, tmp_path, change):
    """Before, each of these read as a run without GPU metrics: not a word on the page."""
    sql, expected = UNREAD[change]
    changed = tmp_path / "changed.sqlite"
    shutil.copy(export, changed)
    with closing(sqlite3.connect(changed)) as db:
        db.executescript(sql)
    summary = summarize(load_trace(changed))
    assert summary["gpu_metrics_unread"].startswith(expected)
    assert summary["ranks"][0]["gpu_metrics"] is None
    from handler.profiling.render import markdown
    assert f"**GPU metrics not read:** {summary['gpu_metrics_unread']}." in markdown(summary, "changed.nsys-rep")


def test_the_real_exports_metrics_are_read_so_nothing_is_unread(summary):
    assert summary["gpu_metrics_unread"] is None and summary["ranks"][0]["gpu_metrics"]
