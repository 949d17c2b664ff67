"""scripts/setup.sh installs the torch and DALI builds that match the NVIDIA driver, says
which, and installs again exactly when the choice changes. Run dry (SETUP_DRY_RUN=1) in a
copy of the repository's set-up files, with a fake nvidia-smi: nothing is installed."""
import shutil
import subprocess
import sys

import pytest

from handler.runtime import cuda_build
from tests.conftest import ROOT
from tests.machine.test_devices import fake_smi, visible


@pytest.fixture
def checkout(tmp_path):
    """The files setup.sh reads, in a folder of their own (so the real .venv is never touched)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "handler" / "runtime").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts")
    shutil.copy(ROOT / "handler" / "runtime" / "cuda_build.py", tmp_path / "handler" / "runtime")
    for req in ROOT.glob("requirements*.txt"):
        shutil.copy(req, tmp_path)
    return tmp_path


def setup_dry(checkout, *, gpus=1, cuda="12.4", fails=False, req="requirements.txt", **env):
    smi = fake_smi(checkout / "bin", gpus=gpus, cuda=cuda, fails=fails)
    full = {k: v for k, v in visible(smi).items() if k != "TORCH_INDEX_URL"}
    full.update(SETUP_DRY_RUN="1", PYTHON_BOOTSTRAP=sys.executable, **env)
    proc = subprocess.run(["bash", str(checkout / "scripts" / "setup.sh"), req], env=full,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def stamp(out: str):
    """(stamp path, the build choice it records) from a dry run's output."""
    line = next(line for line in out.splitlines() if line.startswith("setup: stamp "))
    path, choice = line[len("setup: stamp "):].split(" records: ")
    return path, choice


def install_as(checkout, out: str) -> None:
    """Leave .venv as a real (non-dry) run of the same choice would."""
    path, choice = stamp(out)
    (checkout / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    python = checkout / ".venv" / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # `pip show` finds nothing
    python.chmod(0o755)
    (checkout / path).write_text(choice + "\n")
    index, dali = choice[len("torch from "):].split(", ")
    (checkout / ".venv" / ".build").write_text(f"{'' if index == 'PyPI' else index}\n{dali}\n")


def pip_lines(out: str) -> list:
    return [line for line in out.splitlines() if "pip install" in line]


@pytest.mark.parametrize("cuda, gpus, index, dali", [
    ("13.0", 1, None, "nvidia-dali-cuda130"),
    ("12.4", 2, cuda_build.CU12_INDEX, "nvidia-dali-cuda120"),
    ("12.0", 1, cuda_build.CU12_INDEX, "nvidia-dali-cuda120"),
    (None, 0, None, "nvidia-dali-cuda120")])
def test_setup_installs_and_prints_the_build_the_driver_needs(cuda, gpus, index, dali, checkout):
    out = setup_dry(checkout, gpus=gpus, cuda=cuda or "12.2", fails=cuda is None)
    build = cuda_build.choose_build(tuple(map(int, cuda.split("."))) if cuda else None)
    assert build.torch_index_url == index and build.dali_package == f"{dali}=={cuda_build.DALI_VERSION}"
    assert f"setup: build choice: torch from {index or 'PyPI'}, {build.dali_package} ({build.reason})" in out
    installs = pip_lines(out)
    torch_from_index = [line for line in installs if "--index-url" in line]
    if index:
        assert torch_from_index == [line for line in installs if cuda_build.TORCH_PINS in line]
        assert torch_from_index[0].endswith(f"{cuda_build.TORCH_PINS} --index-url {index}")
    else:
        assert not torch_from_index
    assert installs[-1].endswith(f"pip install -q {build.dali_package}")
    assert not any("nvidia-dali" in line for line in installs[:-1])


def test_torch_index_url_overrides_the_choice_and_keeps_the_drivers_dali(checkout):
    out = setup_dry(checkout, cuda="13.0", TORCH_INDEX_URL="https://mirror.example/whl")
    assert "torch index from TORCH_INDEX_URL" in out
    assert any(line.endswith("--index-url https://mirror.example/whl") for line in pip_lines(out))
    assert pip_lines(out)[-1].endswith("nvidia-dali-cuda130==2.4.0")


def test_an_installed_choice_is_a_silent_no_op_and_the_test_stamp_covers_the_runtime(checkout):
    install_as(checkout, setup_dry(checkout, req="requirements-test.txt"))
    for req in ("requirements-test.txt", "requirements.txt"):
        out = setup_dry(checkout, req=req)
        assert not pip_lines(out) and "build choice" not in out, out


def test_a_changed_driver_or_override_installs_once_more(checkout):
    install_as(checkout, setup_dry(checkout, cuda="12.4"))
    assert not pip_lines(setup_dry(checkout, cuda="12.8"))  # same choice: nothing to do
    for change in (dict(cuda="13.0"), dict(gpus=0, fails=True), dict(cuda="12.4", TORCH_INDEX_URL="https://m/whl")):
        out = setup_dry(checkout, **change)
        assert "setup: .venv holds torch from https://download.pytorch.org/whl/cu126" in out
        assert pip_lines(out), change
    install_as(checkout, setup_dry(checkout, cuda="13.0"))
    assert not pip_lines(setup_dry(checkout, cuda="13.0"))


def test_launch_keeps_an_installed_build_so_a_mismatch_stops_instead_of_downloading(checkout):
    install_as(checkout, setup_dry(checkout, gpus=0, fails=True))
    out = setup_dry(checkout, cuda="12.4", SETUP_KEEP_BUILD="1")
    assert not pip_lines(out) and "build choice" not in out
    assert "SETUP_KEEP_BUILD=1 bash" in (ROOT / "scripts" / "find_python.sh").read_text()  # launch.sh, lab_runs.sh
    # New requirements: launch.sh installs them, still with the builds .venv holds.
    with open(checkout / "requirements.txt", "a") as f:
        f.write("# changed\n")
    installs = pip_lines(setup_dry(checkout, cuda="12.4", SETUP_KEEP_BUILD="1"))
    assert installs and not any("--index-url" in line or "torch==" in line for line in installs)
    assert installs[-1].endswith("nvidia-dali-cuda120==2.4.0")


def test_a_torch_installed_from_another_index_is_replaced(checkout):
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".build").write_text(f"{cuda_build.CU12_INDEX}\nnvidia-dali-cuda120==2.4.0\n")
    # The driver went from CUDA 12 to 13: PyPI's torch replaces the cu126 one of the same version.
    out = setup_dry(checkout, cuda="13.0")
    assert any("--force-reinstall" in line and cuda_build.TORCH_PINS in line and "--index-url" not in line
               for line in pip_lines(out)), out


def test_requirements_leave_dali_to_setup_and_tell_pip_users():
    text = (ROOT / "requirements.txt").read_text()
    pinned = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert not any("dali" in line for line in pinned)
    assert "nvidia-dali-cuda120==2.4.0" in text and "nvidia-dali-cuda130==2.4.0" in text
    assert cuda_build.DALI_VERSION == "2.4.0"


def test_main_prints_the_build_for_the_drivers_cuda_as_shell_assignments(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", fake_smi(tmp_path / "bin", gpus=1, cuda="12.4")["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TORCH_INDEX_URL", raising=False)
    assert cuda_build.main() == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == {"TORCH_INDEX_URL", "TORCH_PINS", "DALI_PACKAGE", "REASON"}
    assert "cu126" in lines["TORCH_INDEX_URL"] and "cuda120" in lines["DALI_PACKAGE"] and "12.4" in lines["REASON"]


def test_both_dali_install_hints_name_the_build_for_the_drivers_cuda(monkeypatch):
    """--mode ddp_dali without DALI and scripts/gpu_check.py say the same, from one place."""
    from handler.DALI.cifar10_loader import require_dali
    from handler.runtime.errors import UserError
    from scripts.gpu_check import no_dali_warning
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali now fails
    for driver, package in (((13, 0), "nvidia-dali-cuda130==2.4.0"), ((12, 4), "nvidia-dali-cuda120==2.4.0"),
                            (None, "nvidia-dali-cuda120==2.4.0")):
        # nvidia-smi is the boundary: no driver here, so its answer is given.
        monkeypatch.setattr(cuda_build, "driver_cuda_version", lambda driver=driver: driver)
        with pytest.raises(UserError) as failure:
            require_dali()
        hint = cuda_build.dali_install_hint()
        assert hint.startswith(f"pip install {package} ") and "scripts/setup.sh" in hint
        assert str(failure.value) == f"--mode ddp_dali needs NVIDIA DALI: {hint}"
        assert no_dali_warning().endswith(f"SKIPPING every ddp_dali check ({hint})")
