"""python -m handler.compare on CPU: a row per cell, real PNG plots, failures recorded not fatal."""
import json
import sys

import pytest
from PIL import Image

from tests.conftest import ROOT, run_cli
from tests.profiling.model.summaries import whole
from handler.compare.cells import DP_CPU_SKIP, Cell, Variant, build_variants, default_counts, matrix, parse_variant
from handler.compare.results import build_rows
from handler.compare.runner import Outcome, last_error_line
from handler.modes import MODES
from handler.runtime.errors import UserError

TINY = ["--model", "resnet20", "--epochs", "1", "--dataset", "synthetic", "--synthetic-train", "256",
        "--synthetic-test", "64", "--batch-size", "32", "--workers", "0", "--valid-size", "0", "--save", "none"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# Its one param carries the `slow` mark to every test that uses the matrix: CI's slow step
# (pytest.ini); the matrix's rules without a run stay in the main suite.
@pytest.fixture(scope="module", params=[pytest.param("dp,ddp", marks=pytest.mark.slow)])
def compared(request, tmp_path_factory):
    """One small matrix: dp and ddp at 1 and 2 processes, plus a cell with a bad option."""
    tmp = tmp_path_factory.mktemp("compare")
    out = tmp / "report"
    run = run_cli(["--modes", request.param, "--counts", "1,2", "--cell", "bad=ddp:--amp nope", "--profile", "0",
                   "--out", out, "--", *TINY, "--data", tmp / "data"],
                  cmd=[sys.executable, "-m", "handler.compare"], cwd=ROOT, env={"OMP_NUM_THREADS": "1"}, timeout=300)
    return run, out, json.loads((out / "results.json").read_text())


def test_every_cell_is_a_row_of_the_report(compared):
    run, out, results = compared
    report = (out / "report.md").read_text()
    names = [c["name"] for c in results["cells"]]
    assert names == ["dp x1", "dp x2", "ddp x1", "ddp x2", "bad x1", "bad x2"], run.stdout + run.stderr
    for name in names:
        assert f"| {name} |" in report


def test_finished_cells_report_time_throughput_and_scaling(compared):
    _, _, results = compared
    done = {c["name"]: c for c in results["cells"] if c["status"] == "ok"}
    assert set(done) == {"dp x1", "ddp x1", "ddp x2"}
    for cell in done.values():
        assert cell["epoch_s"] > 0 and cell["images_per_s"] > 0
    assert done["ddp x2"]["ideal"] == 2 and done["ddp x2"]["speedup"] > 0


def test_a_failing_cell_is_recorded_with_its_exit_code_and_error(compared):
    run, out, results = compared
    bad = [c for c in results["cells"] if c["label"] == "bad"]
    assert all(c["status"] == "failed" and c["exit_code"] == 2 for c in bad)
    assert all("--amp" in c["error"] and "nope" in c["error"] for c in bad)
    assert "failed (exit 2)" in (out / "report.md").read_text()
    assert run.returncode == 1  # the matrix finished, and says that a cell failed


def test_dp_on_cpu_runs_once_and_skips_larger_counts(compared):
    _, _, results = compared
    dp2 = next(c for c in results["cells"] if c["name"] == "dp x2")
    assert dp2["status"] == "skipped" and dp2["error"] == DP_CPU_SKIP


def test_plots_are_real_png_images(compared):
    _, out, results = compared
    assert set(results["plots"].values()) == {"epoch_time.png", "images_per_s.png", "scaling.png", "phases.png"}
    for name in results["plots"].values():
        path = out / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.width >= 400 and image.height >= 200
            low, high = image.convert("L").getextrema()
            assert high - low > 100  # drawn on, not a blank canvas


def test_without_nsys_phase_shares_come_from_the_loops_timers(compared):
    _, out, results = compared
    done = [c for c in results["cells"] if c["status"] == "ok"]
    assert all(c["phase_source"] == "loop timers" for c in done)
    for cell in done:
        assert cell["phases"]["forward"] > 0 and cell["phases"]["backward"] > 0
        assert sum(cell["phases"].values()) == pytest.approx(1.0)
    assert "(loop timers)" in (out / "report.md").read_text()


def test_report_carries_provenance(compared):
    _, out, results = compared
    report = (out / "report.md").read_text()
    for field in ("**date**", "**command**", "**hardware**", "**versions**", "**dataset**"):
        assert field in report
    assert "python -m handler.compare --modes dp,ddp" in report
    assert "synthetic" in results["dataset"]
    assert results["provenance"]["versions"]["torch"]


def test_cell_syntax_takes_label_mode_and_options():
    assert parse_variant("ddp", MODES).label == "ddp"
    variant = parse_variant("ddp:--amp bf16 --channels-last", MODES)
    assert (variant.mode, variant.args, variant.label) == ("ddp", ("--amp", "bf16", "--channels-last"),
                                                           "ddp --amp bf16 --channels-last")
    assert parse_variant("fast=ddp_dali:--amp=bf16", MODES).label == "fast"


@pytest.mark.parametrize("spec", ["nope", "ddp:--num_gpu 2", "ddp:--metrics x.json", "ddp:--mode dp"])
def test_bad_cells_fail_before_running_anything(spec):
    with pytest.raises(UserError):
        build_variants(None, [spec], MODES)


def test_duplicate_labels_are_refused():
    with pytest.raises(UserError, match="LABEL="):
        build_variants("ddp", ["ddp"], MODES)


def test_default_counts_are_capped_at_the_gpus():
    assert default_counts(0) == (1, 2)
    assert default_counts(1) == (1,)
    assert default_counts(3) == (1, 2, 3)
    assert default_counts(8) == (1, 2, 4)


def test_last_error_line_skips_notes_and_progress():
    stderr = "note: CUDA not usable\nlaunch: metrics: x\nerror: --batch-size 3 must split\nlaunch: done\n"
    assert last_error_line(stderr) == "error: --batch-size 3 must split"


def _outcome(label, count, epoch_times, profile=None, phase_s=None):
    epochs = [{"time_s": t, "images_per_s": 100 / t, "data_wait_s": 0.1 * t,
               **({"phase_s": phase_s} if phase_s else {})} for t in epoch_times]
    return Outcome(Cell(Variant(label, "ddp"), count), "ok", exit_code=0,
                   metrics={"epochs": epochs, "test": {"acc": 0.5}}, profile=whole(profile) if profile else None)


def test_scaling_uses_steady_epochs_against_the_smallest_count():
    rows = build_rows([_outcome("ddp", 1, [9.0, 4.0, 4.0]), _outcome("ddp", 2, [9.0, 2.5, 2.5])])
    assert rows[0].epoch_s == 4.0 and rows[0].epochs_timed == 2  # the first epoch is warm-up
    assert rows[1].speedup == pytest.approx(1.6) and rows[1].efficiency == pytest.approx(0.8)


def test_phase_shares_come_from_nsys_else_from_loop_timers():
    summary = {"overall": {"phase_shares": {"data": 0.1, "h2d": None, "forward": 0.3, "backward": 0.4,
                                            "optimizer": 0.1}}}
    nsys, = build_rows([_outcome("a", 1, [1.0], profile=summary)])
    assert nsys.phase_source == "nsys" and nsys.phases["other"] == pytest.approx(0.1)
    timed, = build_rows([_outcome("b", 1, [2.0], phase_s={"data": 0.5, "forward": 0.5, "backward": 1.0})])
    assert timed.phase_source == "loop timers" and timed.phases["data"] == pytest.approx(0.25)
    plain, = build_rows([_outcome("c", 1, [1.0])])
    assert plain.phases is None


def test_variants_that_would_share_a_folder_are_refused():
    with pytest.raises(UserError, match="LABEL="):
        matrix(build_variants(None, ["ddp:--amp bf16", "ddp:--amp=bf16"], MODES), (1,))


def test_a_second_comparison_into_the_same_folder_is_refused_and_leaves_it_alone(compared):
    run, out, _ = compared
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    again = run_cli(["--modes", "ddp", "--counts", "1", "--profile", "0", "--out", out, "--", *TINY],
                    cmd=[sys.executable, "-m", "handler.compare"], cwd=ROOT, timeout=60)
    assert again.returncode == 2 and "already holds a comparison" in again.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_dalis_gpu_work_is_its_own_share_not_other():
    gpu = {"data": 0.0, "h2d": 0.05, "forward": 0.3, "backward": 0.4, "optimizer": 0.05, "data_gpu": 0.15}
    summary = {"overall": {"gpu_phase_shares": gpu, "gpu_data_stall_share": 0.02, "phase_shares": {}}}
    row, = build_rows([_outcome("dali", 1, [1.0], profile=summary)])
    assert row.phase_source == "nsys GPU time"
    assert row.phases["data_gpu"] == pytest.approx(0.15) and row.phases["other"] == pytest.approx(0.03)
