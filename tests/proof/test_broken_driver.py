"""A driver that is installed but unreachable (a kernel update on a rented box, a driver update
without a reboot) is named with nvidia-smi's own message and the fix, in set-up, at launch (the
GPU count, handler/runtime/devices.py) and in gpu_check; "no NVIDIA GPU" is said only where
there is none. One classifier, handler/runtime/cuda_build.py `ask_smi`. No GPU or driver here:
nvidia-smi is a stand-in printing the real messages with their exit codes, and the machine's
PCI bus a fake sysfs (HARNESS_SYSROOT)."""
import os
import shutil
import subprocess
import sys

import pytest

from handler.runtime import cuda_build
from scripts import gpu_check
from tests.conftest import ROOT, error_lines
from tests.machine.test_cuda_build import checkout  # noqa: F401 (a fixture)

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
             "latest NVIDIA driver is installed and running.", 9)
MISMATCH = ("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.54", 18)


def failing_smi(folder, message: str, code: int) -> str:
    """An nvidia-smi that prints `message` and exits `code` whatever it is asked; its folder."""
    folder.mkdir(exist_ok=True)
    (folder / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{message}\nEOF\nexit {code}\n")
    (folder / "nvidia-smi").chmod(0o755)
    return str(folder)


def fake_machine(root, nvidia_gpu: bool) -> str:
    """A sysfs with a host bridge and, if `nvidia_gpu`, an NVIDIA 3D controller (class 0x0302)."""
    devices = root / "sys" / "bus" / "pci" / "devices"
    for slot, vendor, kind in [("0000:00:00.0", "0x8086", "0x060000"), ("0000:17:00.0", "0x10de", "0x030200")][
            :2 if nvidia_gpu else 1]:
        (devices / slot).mkdir(parents=True)
        (devices / slot / "vendor").write_text(vendor + "\n")
        (devices / slot / "class").write_text(kind + "\n")
    return str(root)


def machine_env(tmp_path, message, code, nvidia_gpu=True, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "TORCH_INDEX_URL")}
    return {**env, "PATH": f"{failing_smi(tmp_path / 'bin', message, code)}{os.pathsep}{env['PATH']}",
            "HARNESS_SYSROOT": fake_machine(tmp_path / "machine", nvidia_gpu), **extra}


def said(message: str, code: int) -> str:
    return f'nvidia-smi cannot reach the NVIDIA driver ("{message.splitlines()[0]}", exit {code}): the driver is ' \
           "installed but not working; reboot"


@pytest.mark.parametrize("message, code", [NO_DRIVER, MISMATCH], ids=["no_driver", "mismatch"])
def test_setup_names_a_broken_driver_in_one_line_and_installs_nothing(message, code, checkout, tmp_path):  # noqa: F811
    # Before: "no NVIDIA GPU: PyPI's torch (runs on the CPU)", and setup installed it over the broken driver.
    env = machine_env(tmp_path, message, code, SETUP_DRY_RUN="1", PYTHON_BOOTSTRAP=sys.executable)
    proc = subprocess.run(["bash", str(checkout / "scripts" / "setup.sh")], env=env, capture_output=True,
                          text=True, timeout=30)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert lines[0].startswith("setup: " + said(message, code))
    assert lines[0].endswith("to set up for the CPU anyway: CUDA_VISIBLE_DEVICES= bash scripts/setup.sh")


def test_setup_with_the_gpus_hidden_installs_the_cpu_choice_and_says_the_driver_is_broken(
        checkout, tmp_path):  # noqa: F811
    env = machine_env(tmp_path, *NO_DRIVER, SETUP_DRY_RUN="1", PYTHON_BOOTSTRAP=sys.executable,
                      CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", str(checkout / "scripts" / "setup.sh")], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    choice = next(line for line in proc.stdout.splitlines() if line.startswith("setup: build choice: "))
    assert "nvidia-smi cannot reach the NVIDIA driver" in choice and "no NVIDIA GPU" not in choice
    assert "CUDA_VISIBLE_DEVICES= hides the GPUs: PyPI's torch (runs on the CPU)" in choice


def test_a_failing_nvidia_smi_without_an_nvidia_gpu_on_the_bus_is_no_gpu(tmp_path, monkeypatch):
    # Debian's nvidia-smi on a CPU machine (an earlier install_nsys.sh brought it) says the same.
    env = machine_env(tmp_path, *NO_DRIVER, nvidia_gpu=False)
    done = subprocess.run([sys.executable, str(ROOT / "handler" / "runtime" / "cuda_build.py")], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "REASON='no NVIDIA GPU: PyPI" in done.stdout, done.stderr


@pytest.mark.parametrize("message, code", [NO_DRIVER, MISMATCH], ids=["no_driver", "mismatch"])
def test_a_launch_stops_naming_the_broken_driver_instead_of_training_on_the_cpu(message, code, tmp_path):
    # Before: launch.sh's GPU count (python -m handler.runtime.devices) answered 0: a CPU run.
    env = {**machine_env(tmp_path, message, code), "PYTHON": str(ROOT / ".venv" / "bin" / "python"), "PROFILE": "0"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "launch.sh"), "--epochs", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert said(message, code) in lines[0] and "run on the CPU on purpose with CUDA_VISIBLE_DEVICES=" in lines[0]
    hidden = subprocess.run([env["PYTHON"], "-m", "handler.runtime.devices"], cwd=ROOT,
                            env={**env, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=60)
    assert hidden.returncode == 0 and hidden.stdout.strip() == "0", hidden.stderr


def test_gpu_check_names_the_broken_driver_not_a_missing_gpu(tmp_path, monkeypatch, capsys):
    env = machine_env(tmp_path, *MISMATCH)
    for key in ("PATH", "HARNESS_SYSROOT"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # torch here sees no GPU: the driver's state
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: " + said(*MISMATCH)), lines


def test_a_hung_nvidia_smi_is_a_hung_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_build, "SMI_TIMEOUT_S", 1)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexec sleep 20\n")  # exec: the timeout's kill ends the sleep itself
    smi.chmod(0o755)
    answer = cuda_build.ask_smi(str(smi))
    assert answer.gpus == 0 and answer.problem == "nvidia-smi did not answer within 1 s (the NVIDIA driver is hung)"
    assert "reboot" in answer.broken_driver


def test_no_nvidia_smi_or_an_empty_list_is_no_gpu_and_no_problem(tmp_path):
    assert cuda_build.ask_smi(str(tmp_path / "missing")) == cuda_build.SmiAnswer("")
    failing_smi(tmp_path / "bin", "No devices were found", 0)
    answer = cuda_build.ask_smi(str(tmp_path / "bin" / "nvidia-smi"))
    assert answer.gpus == 0 and answer.problem == ""


@pytest.mark.parametrize("script", ["launch.sh", "lab_runs.sh"])
def test_the_run_flow_without_python_stops_on_setups_one_line(script, tmp_path):
    # Before: setup.sh's line, then "set-up failed; see the pip output above", though pip never ran.
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "handler", copy / "handler", ignore=shutil.ignore_patterns("__pycache__"))
    for req in ROOT.glob("requirements*.txt"):
        shutil.copy(req, copy)
    env = {k: v for k, v in machine_env(tmp_path, *NO_DRIVER, PROFILE="0", PYTHON_BOOTSTRAP=sys.executable).items()
           if k not in ("PYTHON", "VIRTUAL_ENV")}
    proc = subprocess.run(["bash", str(copy / "scripts" / script), *(["ddp"] if script == "lab_runs.sh" else [])], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=60)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("setup: " + said(*NO_DRIVER)) and not (copy / ".venv").exists(), lines
