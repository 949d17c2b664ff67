"""scripts/launch.sh takes its modes from handler/modes.py (README, "Adding a sixth mode"), and
a new launch never destroys an earlier run's results: they move to
NSIGHT_LOG_DIR/earlier/<name>/<time>/ (docs/PROFILING.md, "Earlier runs")."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from handler.modes import MODES
from tests.conftest import run_process
from tests.nsys_helpers import REPO
from tests.tools.test_launch_safety import launch as launch_with_fake_nsys
from tests.tools.test_launch_safety import fake_nsys  # noqa: F401  (a fixture)

LAUNCH = REPO / "scripts" / "launch.sh"
SUFFIXES = ("nsys-rep", "sqlite", "metrics.json", "summary.md", "summary.json")


def test_an_unknown_mode_is_refused_naming_every_mode_of_handler_modes(tmp_path):
    run = run_process(["bash", LAUNCH], cwd=tmp_path, budget=5, env={"MODE": "horovod", "PYTHON": sys.executable})
    assert run.returncode == 2
    line, = run.stderr.strip().splitlines()
    assert "MODE='horovod'" in line and ", ".join(MODES) in line, line


def sixth_mode_checkout(tmp_path: Path) -> Path:
    """A checkout whose handler/modes.py has one more line, `toy`, and a handler/TOY/ folder
    (its MODE is dp's, so it trains without a package of its own); the rest links to this one."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for script in (REPO / "scripts").iterdir():
        (root / "scripts" / script.name).symlink_to(script)
    (root / "scripts" / "launch.sh").unlink()
    shutil.copy(LAUNCH, root / "scripts" / "launch.sh")  # ROOT is where launch.sh lies
    shutil.copy(REPO / "train_cifar.py", root / "train_cifar.py")  # its folder is sys.path[0]
    (root / "models").symlink_to(REPO / "models")
    (root / "handler").mkdir()
    for part in (REPO / "handler").iterdir():
        if part.name not in ("modes.py", "__pycache__"):
            (root / "handler" / part.name).symlink_to(part)
    modes = (REPO / "handler" / "modes.py").read_text()
    line = '    "pp": "handler.PP.mode",\n'
    assert line in modes
    (root / "handler" / "modes.py").write_text(modes.replace(line, line + '    "toy": "handler.TOY.mode",\n'))
    (root / "handler" / "TOY").mkdir()
    (root / "handler" / "TOY" / "__init__.py").write_text('"""A sixth mode for a test: dp under another name."""\n')
    (root / "handler" / "TOY" / "mode.py").write_text("from handler.DP.mode import MODE  # noqa: F401\n")
    return root


def test_a_sixth_mode_in_handler_modes_is_launched_without_editing_launch_sh(tmp_path):
    root = sixth_mode_checkout(tmp_path)
    env = {"MODE": "toy", "NUM_GPUS": "1", "PROFILE": "0", "PYTHON": sys.executable,
           "CKPT_DIR": str(tmp_path / "ckpt"), "NSIGHT_LOG_DIR": str(tmp_path / "logs")}
    run = run_process(["bash", root / "scripts" / "launch.sh", "--help"], cwd=tmp_path, budget=10, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--mode {dp,ddp,ddp_dali,fsdp,pp,toy}" in run.stdout, run.stdout[:1000]


def move_earlier_run(folder: Path, name: str) -> subprocess.CompletedProcess:
    script = f'source "{REPO}/scripts/earlier_runs.sh" && move_earlier_run "$0" "$1"'
    return subprocess.run(["bash", "-c", script, folder, name], capture_output=True, text=True, check=True)


def test_an_earlier_runs_files_move_to_a_folder_named_by_their_time(tmp_path):
    written = time.mktime((2026, 11, 24, 9, 30, 5, 0, 0, -1))
    for suffix in SUFFIXES:
        (tmp_path / f"ddp_cpu2.{suffix}").write_text(suffix)
        os.utime(tmp_path / f"ddp_cpu2.{suffix}", (written + 60, written + 60))
    os.utime(tmp_path / "ddp_cpu2.nsys-rep", (written, written))  # the oldest names the folder
    (tmp_path / "dp_cpu1.metrics.json").write_text("another run name")
    moved = Path(move_earlier_run(tmp_path, "ddp_cpu2").stdout.strip())
    assert moved == tmp_path / "earlier" / "ddp_cpu2" / "20261124-093005"
    assert {p.name: p.read_text() for p in moved.iterdir()} == {f"ddp_cpu2.{s}": s for s in SUFFIXES}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dp_cpu1.metrics.json", "earlier"]
    # A second earlier run from the same second gets a folder of its own; none: nothing printed.
    (tmp_path / "ddp_cpu2.metrics.json").write_text("second")
    os.utime(tmp_path / "ddp_cpu2.metrics.json", (written, written))
    again = Path(move_earlier_run(tmp_path, "ddp_cpu2").stdout.strip())
    assert again != moved and again.parent == moved.parent
    assert (again / "ddp_cpu2.metrics.json").read_text() == "second"
    assert move_earlier_run(tmp_path, "ddp_cpu2").stdout == ""


def test_a_profiled_launch_keeps_the_earlier_runs_report_metrics_and_summary(tmp_path, fake_nsys):  # noqa: F811
    """nsys runs with --force-overwrite; the earlier run's files are gone from its path first."""
    logs = tmp_path / "out" / "logs"
    logs.mkdir(parents=True)
    for suffix in SUFFIXES:
        (logs / f"dp_cpu1.{suffix}").write_text(f"earlier {suffix}")
    run = launch_with_fake_nsys(tmp_path, budget=20, PATH=fake_nsys)
    assert run.returncode == 0, run.stderr[-3000:]
    moved, = (logs / "earlier" / "dp_cpu1").iterdir()
    assert f"the earlier dp_cpu1 run's results: {moved}" in run.stderr
    assert {p.name: p.read_text() for p in moved.iterdir()} == {f"dp_cpu1.{s}": f"earlier {s}" for s in SUFFIXES}
    assert (logs / "dp_cpu1.nsys-rep").read_text() == "partial report\n"  # the new run's, under the lab's name
    assert (logs / "dp_cpu1.metrics.json").read_text().startswith("{")
