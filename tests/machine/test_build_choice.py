"""The torch and DALI builds are chosen by the driver and by the lowest AND the highest compute
capability among the GPUs: the newest GPU sets the oldest build that has its kernels, the oldest
GPU the newest build that still runs it, and the driver the ceiling (docs/GPU_CHECK.md "Builds").
nvidia-smi is the boundary: no GPU here, so a stand-in answers as the driver would."""
import os
import subprocess
import sys

import pytest

from handler.runtime import cuda_build
from tests.conftest import ROOT


def stand_in_smi(folder, gpus, driver="570.124.06", cuda="12.8"):
    """An nvidia-smi on PATH: -L lists `gpus` ((name, capability) pairs), --query-gpu=compute_cap
    gives one line each, the plain call the header with the driver's CUDA version."""
    folder.mkdir(exist_ok=True)
    listing = "; ".join(f"echo 'GPU {i}: {name} (UUID: GPU-{i})'" for i, (name, _) in enumerate(gpus))
    caps = "; ".join(f"echo '{cap}'" for _, cap in gpus)
    smi = folder / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  -L) {listing} ;;
  --query-gpu=compute_cap) {caps} ;;
  *) echo '| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}     |' ;;
esac
""")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "TORCH_INDEX_URL")}
    return {**env, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def choice(env) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "handler" / "runtime" / "cuda_build.py")], env=env,
                          capture_output=True, text=True, timeout=30)
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    return {**{k: v.strip("'") for k, v in lines.items()}, "exit": done.returncode, "stderr": done.stderr}


RTX5090, B200, H100, A100, V100 = (("NVIDIA GeForce RTX 5090", "12.0"), ("NVIDIA B200", "10.0"),
                                   ("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA A100-SXM4-40GB", "8.0"),
                                   ("Tesla V100-SXM2-16GB", "7.0"))


@pytest.mark.parametrize("gpus, driver, cuda", [([RTX5090], "570.124.06", "12.8"),
                                                ([B200, B200], "575.57.08", "12.9"),
                                                ([A100, RTX5090], "570.124.06", "12.8")])
def test_blackwell_on_a_cuda_12_8_or_12_9_driver_gets_the_cu128_build_with_its_kernels(gpus, driver, cuda, tmp_path):
    """The defect: every 12.x driver got cu126, whose kernels stop at sm_90."""
    got = choice(stand_in_smi(tmp_path / "bin", gpus, driver, cuda))
    assert got["exit"] == 0, got["stderr"]
    assert got["TORCH_INDEX_URL"] == CU128, got
    assert got["DALI_PACKAGE"] == "nvidia-dali-cuda120==2.4.0"
    assert f"CUDA {cuda} driver" in got["REASON"] and gpus[-1][1] in got["REASON"], got["REASON"]


CU126, CU128 = "https://download.pytorch.org/whl/cu126", "https://download.pytorch.org/whl/cu128"
# (driver's CUDA, lowest, highest) -> torch index (None: PyPI's CUDA 13 default), DALI's CUDA: the docs' table.
TABLE = [
    ((12, 4), (8, 0), (9, 0), CU126, "cuda120"),
    ((12, 8), (8, 0), (8, 0), CU126, "cuda120"),
    ((12, 8), (8, 0), (12, 0), CU128, "cuda120"),
    ((12, 9), (10, 0), (10, 0), CU128, "cuda120"),
    ((13, 0), (7, 0), (9, 0), CU126, "cuda120"),
    ((13, 0), (7, 5), (12, 0), None, "cuda130"),
    ((13, 0), (10, 0), (10, 3), None, "cuda130"),
    ((13, 0), (8, 9), (8, 9), None, "cuda130"),
]


@pytest.mark.parametrize("driver, lowest, highest, index, dali", TABLE)
def test_the_build_follows_the_driver_and_the_lowest_and_highest_capability(driver, lowest, highest, index, dali):
    build = cuda_build.choose_build(driver, capability=lowest, highest=highest)
    assert build.ok and build.torch_index_url == index and build.dali_package == f"nvidia-dali-{dali}==2.4.0", build


@pytest.mark.parametrize("driver, lowest, highest, says", [
    ((12, 4), (12, 0), (12, 0), "need a CUDA 12.8 or newer driver"),
    ((13, 0), (7, 0), (12, 0), "no torch build has kernels for both"),
    ((12, 8), (6, 0), (12, 0), "no torch build has kernels for both")])
def test_where_no_build_fits_all_three_setup_stops_in_one_line(driver, lowest, highest, says, tmp_path):
    build = cuda_build.choose_build(driver, capability=lowest, highest=highest)
    assert not build.ok and says in build.reason and "\n" not in build.reason
    gpus = [("GPU A", f"{lowest[0]}.{lowest[1]}"), ("GPU B", f"{highest[0]}.{highest[1]}")]
    got = choice(stand_in_smi(tmp_path / "bin", gpus, cuda=f"{driver[0]}.{driver[1]}"))
    lines = got["stderr"].splitlines()
    assert got["exit"] == 2 and len(lines) == 1 and says in lines[0], got
    assert "update the NVIDIA driver" in lines[0] or "separate the GPUs with CUDA_VISIBLE_DEVICES" in lines[0]


def test_the_smi_capabilities_are_the_lowest_and_the_highest(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", stand_in_smi(tmp_path / "bin", [RTX5090, V100, H100])["PATH"])
    assert cuda_build.smi_compute_capabilities() == ((7, 0), (12, 0))
    assert cuda_build.smi_compute_capability() == (7, 0)


def test_setup_stops_in_one_line_where_no_build_fits_and_installs_cu128_for_an_rtx_5090(tmp_path):
    from tests.machine.test_cuda_build import pip_lines
    for name in ("scripts", "handler/runtime"):
        (tmp_path / name).mkdir(parents=True)
    for name in ("scripts/setup.sh", "handler/runtime/cuda_build.py", "requirements.txt", "requirements-test.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    setup = ["bash", str(tmp_path / "scripts" / "setup.sh")]
    env = {**stand_in_smi(tmp_path / "bin", [V100, RTX5090], cuda="13.0"), "SETUP_DRY_RUN": "1",
           "PYTHON_BOOTSTRAP": sys.executable}
    done = subprocess.run(setup, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and not done.stdout, done
    assert done.stderr.startswith("setup: no torch build fits this machine: no torch build has kernels for both")
    env = {**env, **stand_in_smi(tmp_path / "bin", [RTX5090], cuda="12.8")}
    done = subprocess.run(setup, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert any(line.endswith(f"{cuda_build.TORCH_PINS} --index-url {CU128}") for line in pip_lines(done.stdout))


# What plain nvidia-smi does beside a listing (nvidia-smi is the boundary: a stand-in again).
NVML_ERROR = "echo 'Failed to initialize NVML: Unknown Error'; exit 255"
NO_CUDA = "echo '| NVIDIA-SMI 570.124.06   Driver Version: 570.124.06   CUDA Version: N/A     |'"


def listed_but_broken_smi(folder, plain):
    """nvidia-smi -L lists an H100 (with its compute capability), the plain call does `plain`."""
    env = stand_in_smi(folder, [H100])
    smi = folder / "nvidia-smi"
    smi.write_text(smi.read_text().replace("  *) echo '| NVIDIA-SMI", f"  *) {plain} ;;\n  never) echo '"))
    return env


@pytest.mark.parametrize("plain, said", [
    (NVML_ERROR, 'plain nvidia-smi failed ("Failed to initialize NVML: Unknown Error", exit 255)'),
    (NO_CUDA, "plain nvidia-smi shows no CUDA version (CUDA Version: N/A)")], ids=["nvml_error", "no_cuda"])
def test_a_listed_gpu_whose_plain_nvidia_smi_fails_is_a_driver_problem_not_no_gpu(plain, said, tmp_path,
                                                                                  monkeypatch):
    # Before: setup's build choice said "no NVIDIA GPU: PyPI's torch", against the listing, and launch
    # said "install the matching build" (the CPU build's pip line).
    env = listed_but_broken_smi(tmp_path / "bin", plain)
    got = choice(env)
    lines = got["stderr"].splitlines()
    assert got["exit"] == 2 and len(lines) == 1 and "REASON" not in got, got
    assert lines[0].startswith(f"setup: nvidia-smi -L lists the GPUs but {said}: the NVIDIA driver lists the GPUs "
                               "but does not work; reboot, or reinstall the NVIDIA driver"), lines
    assert "no NVIDIA GPU" not in lines[0]
    hidden = choice({**env, "CUDA_VISIBLE_DEVICES": ""})
    assert hidden["exit"] == 0 and said in hidden["REASON"] and "no NVIDIA GPU" not in hidden["REASON"], hidden
    # At launch (the GPU count; this CPU torch sees no GPU, as torch does beside such a driver).
    from handler.runtime.devices import require_usable_gpus
    from handler.runtime.errors import UserError
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(UserError) as err:
        require_usable_gpus()
    assert said in str(err.value) and "\n" not in str(err.value), err.value
    assert "install the matching build" not in str(err.value) and str(err.value).endswith("CUDA_VISIBLE_DEVICES=)")
