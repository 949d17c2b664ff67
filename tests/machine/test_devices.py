"""GPUs are counted in one place (torch), and a machine whose NVIDIA GPUs this torch
cannot use stops in one line instead of training on the CPU with GPU defaults."""
import os
import stat
import subprocess
import time

import pytest

from handler.runtime import cuda_build
from tests.conftest import ROOT, error_lines, run_cli

SMI_HEADER = "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: {cuda}     |"


def fake_smi(folder, gpus: int, cuda: str = "12.2", fails: bool = False):
    """An nvidia-smi on PATH: -L lists `gpus` GPUs, the plain call prints the header.
    `fails` mimics Debian's nvidia-smi on a machine without a driver (exit 9) and without an
    NVIDIA GPU on its PCI bus (HARNESS_SYSROOT: an empty machine, whatever this host has)."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    listing = "\n".join(f"echo 'GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-{i})'" for i in range(gpus))
    body = ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
            if fails else f'if [ "$1" = "-L" ]; then\n{listing or ":"}\nexit 0\nfi\necho "{SMI_HEADER.format(cuda=cuda)}"')
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    machine = {"HARNESS_SYSROOT": str(folder / "empty")} if fails else {}
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", **machine}


def visible(env):
    """The environment as a user has it: CUDA_VISIBLE_DEVICES unset unless given."""
    full = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**full, **env}


@pytest.mark.parametrize("entry", ["train_cifar", "launch"])
def test_gpus_torch_cannot_use_stop_in_one_line_naming_driver_build_and_fix(entry, tmp_path):
    env = visible(fake_smi(tmp_path / "bin", gpus=2))
    cmd = (["bash", str(ROOT / "scripts" / "launch.sh")] if entry == "launch"
           else [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "train_cifar.py")])
    started = time.perf_counter()
    proc = subprocess.run([*cmd, "--epochs", "1"], cwd=tmp_path, env={**env, "PROFILE": "0"},
                          capture_output=True, text=True, timeout=60)
    assert time.perf_counter() - started < 30
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "2 GPU(s) with a CUDA 12.2 driver" in lines[0] and "built for CUDA" in lines[0]
    assert "--index-url https://download.pytorch.org/whl/cu126" in lines[0] and "CUDA_VISIBLE_DEVICES=" in lines[0]
    assert not (tmp_path / "ckpt").exists() and "epoch" not in proc.stdout


def test_hidden_gpus_are_the_explicit_way_to_the_cpu(tmp_path):
    env = {**visible(fake_smi(tmp_path / "bin", gpus=8)), "CUDA_VISIBLE_DEVICES": ""}
    proc = run_cli(["-m", "handler.runtime.devices"], env=env, cmd=[str(ROOT / ".venv" / "bin" / "python")], timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr


@pytest.mark.parametrize("smi", ["debian_without_driver", "none_listed"])
def test_a_cpu_machine_with_an_nvidia_smi_that_lists_nothing_runs_on_the_cpu(smi, tmp_path):
    # After scripts/install_nsys.sh, Debian's nvidia-smi exists and fails (no driver).
    env = visible(fake_smi(tmp_path / "bin", gpus=0, fails=smi == "debian_without_driver"))
    proc = run_cli(["-m", "handler.runtime.devices"], env=env, cmd=[str(ROOT / ".venv" / "bin" / "python")], timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr


@pytest.mark.parametrize("cuda, index, dali", [
    ("13.0", None, "nvidia-dali-cuda130"), ("12.4", cuda_build.CU12_INDEX, "nvidia-dali-cuda120"),
    ("12.0", cuda_build.CU12_INDEX, "nvidia-dali-cuda120")])
def test_the_build_follows_the_drivers_cuda_version(cuda, index, dali, tmp_path):
    fake_smi(tmp_path, gpus=1, cuda=cuda)
    driver = cuda_build.driver_cuda_version(smi=str(tmp_path / "nvidia-smi"))
    assert driver == tuple(map(int, cuda.split(".")))
    build = cuda_build.choose_build(driver)
    assert build.torch_index_url == index and build.dali_package.startswith(dali + "==")
    assert cuda_build.choose_build(driver, "https://mirror/whl").torch_index_url == "https://mirror/whl"


def test_no_or_failing_nvidia_smi_means_no_gpu_and_the_cpu_build(tmp_path):
    fake_smi(tmp_path, gpus=0, fails=True)
    assert cuda_build.driver_cuda_version(smi=str(tmp_path / "nvidia-smi")) is None
    assert cuda_build.driver_cuda_version(smi=str(tmp_path / "missing")) is None
    assert cuda_build.choose_build(None).torch_index_url is None
    assert "update the NVIDIA driver" in cuda_build.choose_build((11, 8)).reason


def test_the_hints_torch_pins_are_the_requirements_pins():
    pins = {line.split("==")[0]: line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    assert cuda_build.TORCH_PINS == f"{pins['torch']} {pins['torchvision']}"


def test_a_machine_without_nvidia_smi_has_no_gpus_and_no_error(tmp_path, monkeypatch):
    from handler.runtime.devices import require_usable_gpus
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi; this torch sees no GPU either
    assert require_usable_gpus() == 0


def test_the_cli_passes_on_torchs_cuda_note_before_a_one_line_error(tmp_path, monkeypatch, capsys):
    # The note comes from torch's CUDA probe (the boundary): a driver too old for this build.
    import train_cifar
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(train_cifar, "cuda_status", lambda: (0, "The NVIDIA driver on your system is too old"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        train_cifar.main(["--mode", "ddp", "--num_gpu", "1", "--ckpt", str(tmp_path / "file")])
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and err[0] == "note: The NVIDIA driver on your system is too old"
    assert err[1].startswith("error: ") and "--ckpt" in err[1]


@pytest.mark.parametrize("variable, repeat", [("0,0", "0"), ("1, 0,1", "1"), ("0,00", "00"), ("GPU-a,GPU-a", "GPU-a")])
def test_a_gpu_named_twice_in_cuda_visible_devices_is_named_not_blamed_on_the_torch_build(variable, repeat, tmp_path):
    # CUDA sees no GPU where one is named twice; before, "torch is built for CUDA ... install the matching build".
    env = {**visible(fake_smi(tmp_path / "bin", gpus=2)), "CUDA_VISIBLE_DEVICES": variable}
    proc = run_cli(["-m", "handler.runtime.devices"], env=env, cmd=[str(ROOT / ".venv" / "bin" / "python")], timeout=60)
    assert proc.returncode == 2 and error_lines(proc) == [
        f"error: CUDA_VISIBLE_DEVICES={variable} names GPU {repeat} twice, and CUDA then sees no GPU at all; list "
        "each GPU once (e.g. CUDA_VISIBLE_DEVICES=0,1)"], proc.stderr


@pytest.mark.parametrize("variable", ["0,1", "", "-1", "GPU-a,GPU-b", "0,-1,0"])
def test_distinct_or_hidden_visible_devices_are_no_repeat(variable):
    from handler.runtime.devices import repeated_visible_device
    assert repeated_visible_device(variable) == ""


BARE_PYTHON_STEP_S = 30


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python without torch, numpy, tqdm or DALI: a fresh venv without pip (about 1 s)."""
    folder = tmp_path_factory.mktemp("bare")
    base = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, timeout=30).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, timeout=60)
    return folder / "venv" / "bin" / "python"


@pytest.mark.parametrize("entry", ["train_cifar", "launch", "run_ddp_dali"])
def test_a_python_without_the_trainers_modules_gets_one_line_per_module_not_a_traceback(entry, bare_python, tmp_path):
    # Before: a ModuleNotFoundError traceback from launch.sh (devices.py) and from train_cifar.py.
    cmd = {"train_cifar": [str(bare_python), str(ROOT / "train_cifar.py"), "--mode", "ddp_dali"],
           "launch": ["bash", str(ROOT / "scripts" / "launch.sh")],
           "run_ddp_dali": ["bash", str(ROOT / "scripts" / "run_ddp_dali.sh")]}[entry]
    env = {**visible({}), "PYTHON": str(bare_python), "MODE": "ddp_dali", "PROFILE": "0", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BARE_PYTHON_STEP_S)
    lines = proc.stderr.splitlines()
    modules = [line.split(" cannot import ")[1].split(",")[0] for line in lines]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert modules == ["torch", "torchvision", "numpy", "tqdm", "PIL", "nvidia.dali"], proc.stderr
    assert all(line.startswith(f"error: {bare_python} cannot import ") for line in lines)
    assert "pip install pillow" in lines[4] and "pip install nvidia-dali-cuda" in lines[5]
    assert not (tmp_path / "nsight_logs").exists() and not (tmp_path / "ckpt").exists()
