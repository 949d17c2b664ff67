"""handler.compare with profiles of GPU runs: the GPU-side phase view and the GPU metrics figure."""
import pytest
from PIL import Image

from handler.compare.__main__ import main
from handler.compare.cells import Cell, Variant
from handler.compare.plots import write_plots
from handler.compare.results import build_rows
from handler.compare.runner import Outcome, cell_environment, reproduce_line
from handler.runtime.errors import UserError
from tests.profiling.model.summaries import whole

GPU_SUMMARY = {"overall": {"phase_shares": {"data": 0.01, "h2d": 0.0, "forward": 0.2, "backward": 0.3,
                                            "optimizer": 0.05},
                           "gpu_phase_shares": {"data": 0.0, "h2d": 0.05, "forward": 0.3, "backward": 0.4,
                                                "optimizer": 0.1},
                           "gpu_data_stall_share": 0.08}}


def gpu_outcome(mode, count, sm_active, pcie_tx):
    ranks = [{"gpu_metrics": {str(r): {"sm_active_pct": {"mean": sm_active + r, "p95": 99},
                                       "pcie_tx_mbps": {"mean": pcie_tx, "p95": pcie_tx}}}} for r in range(count)]
    epochs = [{"time_s": 2.0, "images_per_s": 50.0, "data_wait_s": 0.1}]
    return Outcome(Cell(Variant(mode, mode), count), "ok", exit_code=0,
                   metrics={"epochs": epochs, "test": {"acc": 0.5}}, profile=whole({**GPU_SUMMARY, "ranks": ranks}))


def test_gpu_runs_compare_gpu_time_per_phase_with_data_as_the_gpu_sees_it():
    row, = build_rows([gpu_outcome("ddp", 2, 60, 100)])
    assert row.phase_source == "nsys GPU time"
    assert row.phases["data"] == pytest.approx(0.08) and row.phases["backward"] == pytest.approx(0.4)
    assert row.phases["other"] == pytest.approx(1 - 0.08 - 0.05 - 0.3 - 0.4 - 0.1)


def test_gpu_metrics_are_averaged_over_the_cells_gpus_and_plotted_per_mode_and_count(tmp_path):
    rows = build_rows([gpu_outcome("dp", 2, 40, 900), gpu_outcome("ddp", 2, 60, 300), gpu_outcome("ddp", 1, 70, 0)])
    assert rows[0].gpu_metrics == {"sm_active_pct": pytest.approx(40.5), "pcie_tx_mbps": pytest.approx(900)}
    plots = write_plots(rows, tmp_path)
    name = plots["GPU metrics inside training epochs"]
    with Image.open(tmp_path / name) as image:
        assert image.size[1] > image.size[0] / 2  # two panels stacked: SM active, PCIe TX


def test_cpu_comparisons_draw_no_gpu_metrics_figure(tmp_path):
    row = build_rows([gpu_outcome("ddp", 1, 50, 0)])[0]
    row.gpu_metrics = None
    assert "GPU metrics inside training epochs" not in write_plots([row], tmp_path)


def test_gpu_metrics_option_reaches_launch_and_the_reproduce_line(tmp_path):
    cell = Cell(Variant("ddp", "ddp"), 2)
    assert cell_environment(cell, tmp_path, True, gpu_metrics=True)["GPU_METRICS"] == "1"
    assert cell_environment(cell, tmp_path, True)["GPU_METRICS"] == "0"
    assert reproduce_line(cell, tmp_path, True, [], gpu_metrics=True).startswith(
        "MODE=ddp NUM_GPUS=2 PROFILE=1 GPU_METRICS=1 scripts/launch.sh")


def test_gpu_metrics_without_profiling_is_refused(tmp_path):
    with pytest.raises(UserError, match="--gpu-metrics samples through nsys"):
        main(["--modes", "ddp", "--profile", "0", "--gpu-metrics", "--out", str(tmp_path / "c")])
