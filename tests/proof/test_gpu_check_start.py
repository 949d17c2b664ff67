"""gpu_check's start: its --budget counts from gpu_check's own start (the environment report and
the nsys probe took over 2 minutes on a slow nsys, outside the budget), and a Python that lacks
an import the trainer needs gets one line per missing piece instead of a traceback per row; so
does a bad --budget or --out, before anything runs."""
import json
import os
import sys

import pytest

from scripts import gpu_check


def slow_nsys(folder, seconds):
    """An nsys on PATH whose probe takes `seconds` and makes no report (a slow, broken install)."""
    folder.mkdir()
    (folder / "nsys").write_text(f"#!/bin/sh\nsleep {seconds}\necho 'nsys: no report' >&2\nexit 1\n")
    (folder / "nsys").chmod(0o755)
    return folder


def test_the_budget_counts_from_gpu_checks_start_not_after_the_nsys_probe(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # main sets it for --rehearse; restored after
    monkeypatch.setenv("PATH", f"{slow_nsys(tmp_path / 'bin', 4)}:{os.environ['PATH']}")
    # ddp's estimate on a CPU is 5 s: it fits a 7 s budget only if the 4 s probe is not counted.
    code = gpu_check.main(["--rehearse", "--only", "profiled*,ddp", "--budget", "7", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 3, out
    rows = json.loads((tmp_path / "o" / "gpu_check.json").read_text())["checks"]
    assert [(r["check"], r["result"]) for r in rows] == [("ddp", "not run"), ("profiled run (nsys)", "skip")]
    assert "its estimate 5 s is over the" in out and "s of it left after the set-up" in out


def test_a_python_without_numpy_or_tqdm_gets_one_line_per_missing_piece(monkeypatch, capsys):
    for module in ("numpy", "tqdm"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails, find_spec finds nothing
    assert gpu_check.main(["--rehearse", "--offline", "--list"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"gpu_check: {sys.executable} cannot import ") for line in lines)
    assert "import numpy, which train_cifar.py needs" in lines[0] and lines[0].endswith("with PYTHON=")
    assert "pip install tqdm" in lines[1]


@pytest.mark.parametrize("option, value, said", [
    ("--budget", "-5", "--budget -5 is not a finite number of seconds above 0"),
    ("--budget", "0", "--budget 0 is not a finite number of seconds above 0"),
    ("--budget", "nan", "--budget nan is not a finite number"), ("--budget", "inf", "--budget inf is not a finite"),
    ("--out", "{file}", "--out {file} is a file; name a folder"),
    ("--out", "{file}/runs/a", "--out {file}/runs/a is under {file}, which is a file; name a folder"),
    ("--out", "/proc/gpu_check_out", "--out /proc/gpu_check_out: cannot write in /proc (")])
def test_a_bad_budget_or_out_stops_in_one_line_before_anything_runs(option, value, said, tmp_path, capsys):
    # Before: --budget -5 ran (and exited 3); an --out under a file ended in a NotADirectoryError traceback.
    file = tmp_path / "report.md"
    file.write_text("")
    assert gpu_check.main([option, value.format(file=file)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: " + said.format(file=file)), lines
    assert captured.out == "" and sorted(tmp_path.iterdir()) == [file]


@pytest.mark.parametrize("only, said", [("", "--only '' names no check"), (",", "--only ',' names no check"),
                                        (" ", "--only ' ' names no check"),
                                        ("ddp,nope*", "--only nope*: no such check; `--list` names them")])
def test_an_empty_or_unknown_only_is_refused_in_one_line_not_read_as_every_check(only, said, tmp_path, capsys):
    # Before: --only '' (or ',' or ' ') selected all 32 checks, the whole 10-minute run.
    assert gpu_check.main(["--rehearse", "--list", "--only", only, "--out", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: " + said), lines
    assert captured.out == "" and not (tmp_path / "o").exists()


def fresh_clone(tmp_path):
    """scripts/ and handler/ without .venv; setup.sh replaced by one that marks that it ran and
    fails, and a package index that answers (a file:// URL), so every path leads to the set-up."""
    import shutil
    from tests.conftest import ROOT
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(ROOT / "handler", tmp_path / "handler")
    marker = tmp_path / "set-up ran"
    (tmp_path / "scripts" / "setup.sh").write_text(f"touch '{marker}'; echo 'setup: installing' >&2; exit 1\n")
    (tmp_path / "index").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    return marker, {**env, "GPU_CHECK_INDEX_URL": (tmp_path / "index").as_uri()}


@pytest.mark.parametrize("options, said", [
    (["--budget", "-5"], "--budget -5 is not a finite number"), (["--only", ""], "--only '' names no check"),
    (["--only", "nope"], "--only nope: no such check"), (["--out", "/dev/null/x"], "--out /dev/null/x is under"),
    (["--list", "--budget"], "argument --budget: expected one argument"),
    (["--bogus"], "unrecognized arguments: --bogus"), (["--part", "3/2"], "--part 3/2: K must be 1..N")])
def test_gpu_check_sh_says_a_bad_option_in_one_line_before_any_set_up(options, said, tmp_path):
    # Before: on a fresh clone --budget -5 first installed everything (minutes, about 10 GiB), then refused.
    import subprocess
    marker, env = fresh_clone(tmp_path)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), *options], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("gpu_check: " + said), done.stderr
    assert not marker.exists() and not (tmp_path / ".venv").exists()


def test_gpu_check_sh_with_a_python_that_is_not_there_says_so_in_one_line(tmp_path):
    # Before: bash's "No such file or directory" from exec, exit 127.
    import subprocess
    marker, env = fresh_clone(tmp_path)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "--list"], cwd=tmp_path,
                          env={**env, "PYTHON": str(tmp_path / "nowhere")}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"gpu_check: PYTHON={tmp_path / 'nowhere'} is not a program that runs; name a Python 3 that has torch, or "
        "unset PYTHON"], done.stderr
    assert not marker.exists()


def test_gpu_check_sh_with_good_options_on_a_fresh_clone_goes_on_to_the_set_up(tmp_path):
    # The test above proves something only if good options reach the set-up in the same clone.
    import subprocess
    marker, env = fresh_clone(tmp_path)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "--list", "--only", "ddp*"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and marker.exists(), done.stderr
    assert done.stderr.splitlines()[0] == "setup: installing"


def test_gpu_check_names_a_gpu_listed_twice_in_cuda_visible_devices(tmp_path, monkeypatch, capsys):
    # Before: "no usable CUDA GPU (none visible)", as if the machine had none.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,1")
    assert gpu_check.main(["--list", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpu_check: CUDA_VISIBLE_DEVICES=1,1 names GPU 1 twice, and CUDA then sees no GPU at all; list each GPU once "
        "(e.g. CUDA_VISIBLE_DEVICES=0,1)"]


def test_gpu_check_names_a_listed_gpu_whose_plain_nvidia_smi_fails(tmp_path, monkeypatch, capsys):
    # nvidia-smi is the boundary (a stand-in); this torch sees no GPU, as torch does beside such a driver.
    from tests.machine.test_build_choice import NVML_ERROR, listed_but_broken_smi
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", listed_but_broken_smi(tmp_path / "bin", NVML_ERROR)["PATH"])
    assert gpu_check.main(["--list", "--out", str(tmp_path / "o")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        'gpu_check: nvidia-smi -L lists the GPUs but plain nvidia-smi failed ("Failed to initialize NVML: Unknown '
        'Error", exit 255): the NVIDIA driver lists the GPUs but does not work; reboot'), lines
