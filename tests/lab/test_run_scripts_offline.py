"""The kit's run flow on a machine without a package index (a cluster's compute node, a GPU box
with torch preinstalled): without PYTHON, scripts/run_ddp.sh takes the active virtual
environment's Python, says so, installs nothing and trains both runs, where it used to run
pip for minutes and stop. Offline here is a network namespace with only loopback, as .ci/run
rehearses gpu_check (scripts/find_python.sh is shared with it)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, error_lines, run_process
from tests.lab.test_lab_run_scripts import write_tree


def offline(command: str) -> list:
    """`command` in a network namespace of its own with only loopback: no index answers."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -n (root, or user namespaces), as .ci/run's rehearsal does")
    return ["unshare", "-n", "bash", "-c", f"ip link set lo up && {command}"]


def checkout(folder):
    """A checkout without .venv, whose outputs land in `folder`."""
    for name in ("scripts", "handler", "models", "train_cifar.py", "requirements.txt", "requirements-test.txt"):
        os.symlink(ROOT / name, folder / name)


def without_python(env, path):
    return {**{k: v for k, v in env.items() if k not in ("PYTHON", "VIRTUAL_ENV")}, "PATH": path}


@pytest.mark.slow  # two trainings in a network namespace, the costliest main-run check (60 s): CI's slow step (pytest.ini)
def test_without_an_index_run_ddp_trains_both_runs_with_the_active_venv_and_installs_nothing(tmp_path):
    checkout(tmp_path)
    write_tree(tmp_path / "dataset" / "cifar10")  # 110 training images: one step an epoch
    # An activated virtual environment that has torch: what `source venv/bin/activate` sets.
    venv = sys.prefix
    env = {**without_python(os.environ, f"{venv}/bin{os.pathsep}{os.environ['PATH']}"), "VIRTUAL_ENV": venv,
           "PROFILE": "0", "TIMESTAMP": "t0"}
    run = run_process(offline("exec bash scripts/run_ddp.sh --epochs 1 --no-progress"), cwd=tmp_path, budget=40,
                      env=env, inherit=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    chosen = [line for line in run.stderr.splitlines() if line.startswith("lab_runs: ")]
    assert chosen == [f"lab_runs: no package index answered within 5 s: using {venv}/bin/python "
                      f"(torch {torch.__version__}); installing nothing (PYTHON= names another)"], run.stderr
    assert "setup:" not in run.stdout + run.stderr and not (tmp_path / ".venv").exists()
    for processes in (1, 2):
        metrics = json.loads((tmp_path / "nsight_logs" / "ddp_t0" / f"gpu_{processes}.metrics.json").read_text())
        assert metrics["env"]["world_size"] == processes and len(metrics["epochs"]) == 1
        assert metrics["env"]["dataset"] == "cifar10", "trained on the tree in dataset/cifar10"


def test_without_an_index_and_without_torch_it_names_the_fix_in_one_line(tmp_path):
    checkout(tmp_path)
    bare = "/usr/bin:/bin"  # the system's Python, without torch
    if subprocess.run(["python3", "-c", "import torch"], env={"PATH": bare}, capture_output=True).returncode == 0:
        pytest.skip("this system's python3 has torch")
    run = run_process(offline("exec bash scripts/run_ddp.sh"), cwd=tmp_path, budget=15,
                      env=without_python(os.environ, bare), inherit=False)
    assert run.returncode == 2 and error_lines(run) == [
        "lab_runs: no package index answered within 5 s and no Python with torch was found (tried .venv/bin/python, "
        "python3, python); set PYTHON=/path/to/python (one with torch), or connect to a package index"], run.stderr
    assert not (tmp_path / ".venv").exists() and not (tmp_path / "nsight_logs").exists()
