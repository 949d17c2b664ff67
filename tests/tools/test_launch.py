"""scripts/launch.sh end to end on CPU (docs/PROFILING.md): profiled runs, nsys-less runs, runs that
never replace an earlier run, bad settings."""
import json

import pytest
import torch

from tests.conftest import run_process
from tests.nsys_helpers import REPO, once_more_if_nsys_failed_to_start, path_without_nsys, require_nsys
from tests.parallel import one_at_a_time

LAUNCH = REPO / "scripts" / "launch.sh"
EPOCHS, RANKS, BATCHES = 2, 2, 4  # 256 images / global batch 64
TINY = ["--model", "resnet20", "--epochs", str(EPOCHS), "--dataset", "synthetic", "--synthetic-train", "256",
        "--synthetic-test", "128", "--batch-size", "64", "--workers", "0", "--valid-size", "0", "--no-progress"]
CPU_PHASES = ("data", "forward", "backward", "optimizer")  # h2d appears only when a copy happens


def launch(tmp_path, *args, budget=10, **env):
    """scripts/launch.sh; `budget`: its measured seconds (10: a launch that stops before training)."""
    settings = {"NUM_GPUS": str(RANKS), "DATA_DIR": str(tmp_path / "data"), "CKPT_DIR": str(tmp_path / "ckpt"),
                "NSIGHT_LOG_DIR": str(tmp_path / "logs"), **env}
    return run_process(["bash", LAUNCH, *args], cwd=tmp_path, env=settings, budget=budget)


# ddp_dali: CI's slow step (pytest.ini); ddp stays in the main suite.
@pytest.fixture(scope="module", params=["ddp", pytest.param("ddp_dali", marks=pytest.mark.slow)])
def profiled(request, tmp_path_factory):
    """(mode, finished launch, its log folder) for one profiled CPU run per mode."""
    require_nsys()
    tmp_path = tmp_path_factory.mktemp(request.param)
    with one_at_a_time("nsys"):
        run = once_more_if_nsys_failed_to_start(lambda: launch(tmp_path, *TINY, MODE=request.param, PROFILE="1", budget=40))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return request.param, run, tmp_path / "logs"


def summary_of(profiled) -> dict:
    mode, _, logs = profiled
    return json.loads((logs / f"{mode}_cpu{RANKS}.summary.json").read_text())


def test_profiled_run_writes_report_metrics_and_summary_line(profiled):
    mode, run, logs = profiled
    assert (logs / f"{mode}_cpu{RANKS}.nsys-rep").is_file()
    assert (logs / f"{mode}_cpu{RANKS}.metrics.json").is_file()
    assert "CPU smoke configuration" in run.stderr
    assert any(line.startswith("profile: data-stall ") for line in run.stdout.splitlines())


def test_report_has_epoch_and_batch_ranges_from_every_rank(profiled):
    ranks = summary_of(profiled)["ranks"]
    assert [r["rank"] for r in ranks] == list(range(RANKS))
    assert sum(len(r["epochs"]) for r in ranks) == EPOCHS * RANKS
    assert sum(r["batches"]["count"] for r in ranks) == EPOCHS * BATCHES * RANKS


def test_cpu_batches_hold_every_phase_but_h2d(profiled):
    for rank in summary_of(profiled)["ranks"]:
        assert {name: rank["phases"][name]["count"] for name in CPU_PHASES} == \
            {name: EPOCHS * BATCHES for name in CPU_PHASES}
        assert rank["phases"]["h2d"]["count"] == 0


def test_ddp_summary_has_allreduce_ranges_and_a_comm_share(profiled):
    """handler/DDP/comm_hook.py's `allreduce b{k}` ranges, read back from the nsys report."""
    summary = summary_of(profiled)
    for rank in summary["ranks"]:
        comm = rank["comm"]
        assert comm["source"] == "allreduce ranges" and comm["allreduce_ranges"] >= EPOCHS * BATCHES
        assert 0 < comm["share"] < 1 and 0 <= comm["overlap_share"] <= 1
        assert comm["exposed_s"] == pytest.approx(comm["seconds"] * (1 - comm["overlap_share"]))
    assert summary["stragglers"]["steps"] == EPOCHS * BATCHES
    assert sum(summary["stragglers"]["last_rank_counts"].values()) == EPOCHS * BATCHES
    assert "comm " in summary["one_line"]


def test_report_epoch_times_agree_with_metrics(profiled):
    comparison = summary_of(profiled)["metrics_comparison"]
    assert [c["epoch"] for c in comparison] == list(range(EPOCHS))
    for c in comparison:
        assert c["nsys_s"] == pytest.approx(c["metrics_s"], rel=0.05, abs=0.02), c


def test_metrics_record_the_nsys_version(profiled):
    mode, _, logs = profiled
    metrics = json.loads((logs / f"{mode}_cpu{RANKS}.metrics.json").read_text())
    version = run_process(["nsys", "--version"], budget=2).stdout
    assert metrics["env"]["nsys"] and metrics["env"]["nsys"] in version


@pytest.fixture(scope="module")
def launched_twice(tmp_path_factory):
    """(tmp folder, [three finished launches]): PROFILE=0 without nsys on PATH and without
    CKPT_DIR: a one-epoch run, the same again, then --resume to a second epoch."""
    tmp_path = tmp_path_factory.mktemp("twice")
    # dp: one process per launch (the mode does not matter here; ddp would start a rank too)
    env = {"MODE": "dp", "NUM_GPUS": "1", "PROFILE": "0", "DATA_DIR": str(tmp_path / "data"),
           "NSIGHT_LOG_DIR": str(tmp_path / "logs"), "PATH": path_without_nsys(tmp_path)}
    tiny = ["--dataset", "synthetic", "--synthetic-train", "128", "--synthetic-test", "32", "--batch-size", "64",
            "--workers", "0", "--valid-size", "0", "--no-progress", "--epochs", "1"]
    runs = []
    for args in (tiny, tiny, [*tiny[:-1], "2", "--resume"]):
        runs.append(run_process(["bash", LAUNCH, *args], cwd=tmp_path, env=env, budget=15))
        assert runs[-1].returncode == 0, runs[-1].stderr[-3000:]
    return tmp_path, runs


def test_profile_0_trains_without_nsys(launched_twice):
    tmp_path, runs = launched_twice
    assert (tmp_path / "logs" / "dp_cpu1.metrics.json").is_file()
    assert not list((tmp_path / "logs").glob("*.nsys-rep"))
    assert not any("UNPROFILED" in run.stderr for run in runs)


def test_launch_twice_in_a_row_keeps_both_runs_and_resume_continues_the_newest(launched_twice):
    tmp_path, runs = launched_twice
    folders = sorted((tmp_path / "ckpt" / "dp_cpu1").iterdir())
    assert len(folders) == 2 and all((folder / "last.pt").exists() for folder in folders)
    assert torch.load(folders[0] / "last.pt", weights_only=True)["epoch"] == 1
    assert torch.load(folders[1] / "last.pt", weights_only=True)["epoch"] == 2  # the resumed one
    assert "resumed from" in runs[-1].stdout


def test_each_launch_keeps_the_earlier_launches_metrics_under_their_time(launched_twice):
    tmp_path, runs = launched_twice
    earlier = sorted((tmp_path / "logs" / "earlier" / "dp_cpu1").iterdir())
    assert len(earlier) == 2, earlier  # the first and the second launch's, moved by the next one
    assert all(f"the earlier dp_cpu1 run's results: {folder}" in run.stderr for folder, run in zip(earlier, runs[1:]))
    firsts = [json.loads((folder / "dp_cpu1.metrics.json").read_text()) for folder in earlier]
    assert [len(m["epochs"]) for m in firsts] == [1, 1]
    assert len(json.loads((tmp_path / "logs" / "dp_cpu1.metrics.json").read_text())["epochs"]) == 2  # the newest


def test_profile_auto_without_nsys_warns_and_runs_unprofiled(tmp_path):
    failing_installer = tmp_path / "no_install.sh"
    failing_installer.write_text("exit 1\n")  # never the real installer in a test (it would run apt-get as root)
    run = launch(tmp_path, "--help", MODE="ddp", PATH=path_without_nsys(tmp_path), NSYS_INSTALLER=str(failing_installer),
                 budget=15)
    assert run.returncode == 0, run.stderr
    assert "running UNPROFILED" in run.stderr and "usage:" in run.stdout


def assert_one_line_failure(run, *fragments):
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), run.stderr


def test_profile_1_without_nsys_fails_in_one_line(tmp_path):
    run = launch(tmp_path, MODE="ddp", PROFILE="1", PATH=path_without_nsys(tmp_path))
    assert_one_line_failure(run, "PROFILE=1", "nsys", "scripts/install_nsys.sh")


def test_unknown_mode_fails_in_one_line(tmp_path):
    assert_one_line_failure(launch(tmp_path, MODE="horovod"), "MODE='horovod'", "ddp_dali")


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_bad_num_gpus_fails_in_one_line(tmp_path, count):
    assert_one_line_failure(launch(tmp_path, MODE="ddp", NUM_GPUS=count), f"NUM_GPUS='{count}'", "positive integer")


# ---- the capture window (docs/PROFILING.md, "Capture window") --------------------------------
WINDOW_EPOCHS = 4
WINDOW_RUN = ["--model", "resnet20", "--epochs", str(WINDOW_EPOCHS), "--dataset", "synthetic",
              "--synthetic-train", "128", "--synthetic-test", "64", "--batch-size", "64", "--workers", "0",
              "--valid-size", "0", "--no-progress"]


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """{window: (finished launch, its log folder)}: the same 4-epoch 2-rank run captured with
    PROFILE_EPOCHS=1:2 and whole (all)."""
    require_nsys()
    runs = {}
    for window in ("1:2", "all"):
        tmp_path = tmp_path_factory.mktemp("window")
        with one_at_a_time("nsys"):
            run = once_more_if_nsys_failed_to_start(
                lambda: launch(tmp_path, *WINDOW_RUN, MODE="ddp", PROFILE="1", PROFILE_EPOCHS=window, budget=60))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        runs[window] = run, tmp_path / "logs"
    return runs


@pytest.mark.slow  # two 4-epoch profiled runs for 3 checks: CI's slow step
def test_a_window_1_2_report_holds_exactly_epochs_1_and_2_on_every_rank(windowed):
    run, logs = windowed["1:2"]
    summary = json.loads((logs / f"ddp_cpu{RANKS}.summary.json").read_text())
    assert summary["rank_source"] == "nvtx mark"  # the rank marks are re-emitted inside the window
    assert [[e["epoch"] for e in r["epochs"]] for r in summary["ranks"]] == [[1, 2]] * RANKS
    assert all(r["host"] for r in summary["ranks"])
    assert all(r["batches"]["count"] == 2 * 2 for r in summary["ranks"])  # 2 epochs x 2 steps
    assert summary["capture_window"]["epochs"] == [1, 2] and summary["capture_window"]["run_epochs"] == WINDOW_EPOCHS
    assert summary["one_line"].endswith("[epochs 1-2 of 4]"), summary["one_line"]
    # both captured epochs come after the warm-up (epoch 0): the measured epoch keeps both, and the head
    # line, launch's last line, prints it (issue 55, one epoch figure)
    measured = summary["measured_epoch"]
    assert measured["epochs"] == [1, 2] and f"epoch {measured['s']:.2f} s" in summary["one_line"]
    assert run.stdout.strip().splitlines()[-1] == summary["one_line"]
    assert "nsys captures epochs 1-2 of 4; the other epochs train unprofiled" in run.stderr
    assert "profiling epochs 1-2 of 4" in run.stdout


@pytest.mark.slow  # two 4-epoch profiled runs for 3 checks: CI's slow step
def test_a_windowed_run_still_has_every_epoch_in_its_metrics(windowed):
    _, logs = windowed["1:2"]
    metrics = json.loads((logs / f"ddp_cpu{RANKS}.metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == list(range(WINDOW_EPOCHS))
    assert metrics["env"]["profiled_epochs"] == [1, 2] and metrics["config"]["profile_epochs"] == "1:2"
    outside = json.loads((logs / f"ddp_cpu{RANKS}.summary.json").read_text())["capture_window"]["outside"]
    assert [o["epoch"] for o in outside] == [0, 3] and all(o["metrics_s"] > 0 for o in outside)


@pytest.mark.slow  # two 4-epoch profiled runs for 3 checks: CI's slow step
def test_a_windowed_report_is_much_smaller_than_a_whole_capture(windowed):
    window, whole = (windowed[w][1] / f"ddp_cpu{RANKS}.nsys-rep" for w in ("1:2", "all"))
    summary = json.loads((windowed["all"][1] / f"ddp_cpu{RANKS}.summary.json").read_text())
    assert [[e["epoch"] for e in r["epochs"]] for r in summary["ranks"]] == [list(range(WINDOW_EPOCHS))] * RANKS
    assert window.stat().st_size < 0.6 * whole.stat().st_size, (window.stat().st_size, whole.stat().st_size)


@pytest.mark.parametrize("window", ["1-2", "x", "2:1:3"])
def test_a_bad_profile_epochs_fails_in_one_line(tmp_path, window):
    assert_one_line_failure(launch(tmp_path, MODE="ddp", PROFILE_EPOCHS=window), f"PROFILE_EPOCHS='{window}'", "A:B")
