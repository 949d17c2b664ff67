"""A CPU-only machine is never taken for a GPU machine, without a driver library and
with the one an earlier scripts/install_nsys.sh installed: Debian's nsight-systems package
brings an nvidia-smi that fails without a driver and a CUDA 12 libcuda, so torch warns that
"the NVIDIA driver on your system is too old" (today's install unpacks nsys without them,
docs/PROFILING.md). In both states a user's run (GPUs not hidden) must choose the CPU
settings, train on the CPU and say why CUDA is unusable only when torch said so.

The rest of the suite hides GPUs from CPU tests (conftest), so it is correct in both
states by construction; tests/machine/test_devices.py covers the fake-nvidia-smi states."""
import ctypes.util
import os

import pytest

from tests.conftest import ROOT, gpu_count, read_metrics, run_process
from tests.machine.test_devices import fake_smi

TINY = ["--synthetic-train", "128", "--synthetic-test", "32", "--batch-size", "32", "--valid-size", "0",
        "--epochs", "1", "--workers", "0", "--no-progress"]


def without(tool, tmp_path) -> str:
    """$PATH without `tool` (path_without_nsys's link farm, for another name)."""
    entries = []
    for i, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        if os.path.exists(os.path.join(entry, tool)):
            farm = tmp_path / f"path-without-{tool}-{i}"
            farm.mkdir(exist_ok=True)
            for name in os.listdir(entry):
                if name != tool and not (farm / name).is_symlink():
                    (farm / name).symlink_to(os.path.join(entry, name))
            entry = str(farm)
        entries.append(entry)
    return os.pathsep.join(entries)


def before_install(tmp_path) -> dict:
    """No nvidia-smi, and no libcuda/libnvidia-ml that the loader can open: unreadable
    stand-ins first on LD_LIBRARY_PATH make dlopen fail as on a machine without them."""
    libs = tmp_path / "no-driver-libs"
    libs.mkdir()
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        (libs / name).write_text("not a library\n")
    return {"PATH": without("nvidia-smi", tmp_path), "LD_LIBRARY_PATH": str(libs)}


def after_install(tmp_path) -> dict:
    """Debian's failing nvidia-smi on PATH and a CUDA 12 libcuda without a driver: a machine an
    earlier install_nsys.sh left them on (it now unpacks nsys without them; a CPU machine after
    today's install is the "before" state, tests/tools/test_nsys_install.py checks it)."""
    if not ctypes.util.find_library("cuda"):
        pytest.skip("no libcuda on this machine (only an earlier scripts/install_nsys.sh brought Debian's)")
    return fake_smi(tmp_path / "bin", gpus=0, fails=True)


@pytest.mark.parametrize("state", ["before install_nsys.sh", "after an earlier install_nsys.sh"])
def test_a_cpu_machine_launches_the_cpu_configuration_and_trains_on_the_cpu(state, tmp_path):
    if gpu_count():
        pytest.skip("a GPU machine: this is about machines without one")
    env = before_install(tmp_path) if state.startswith("before") else after_install(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}, **env,
           "MODE": "dp", "PROFILE": "0", "DATA_DIR": str(tmp_path / "data"), "CKPT_DIR": str(tmp_path / "ckpt"),
           "NSIGHT_LOG_DIR": str(tmp_path / "logs")}
    run = run_process(["bash", ROOT / "scripts" / "launch.sh", "--dataset", "synthetic", *TINY],
                      cwd=tmp_path, env=env, budget=20)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "no GPU visible: CPU smoke configuration" in run.stderr
    m = read_metrics(tmp_path / "logs" / "dp_cpu2.metrics.json")  # the CPU name, never dp_gpuN
    assert m["env"]["device"] == "cpu" and not m["env"]["gpus"]
    notes = [n for n in m["env"].get("notes", []) if "CUDA not usable" in n]
    cuda_lines = [line for line in run.stderr.splitlines() if "CUDA not usable" in line]
    if state.startswith("after"):  # torch's driver warning becomes one note, printed once
        assert len(notes) == 1 and "too old" in notes[0], m["env"].get("notes")
        assert len(cuda_lines) == 1
    else:
        assert not notes and not cuda_lines, run.stderr
