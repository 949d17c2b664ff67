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
