"""gpu_check's start: its --budget counts from gpu_check's own start (the environment report and
the nsys probe took over 2 minutes on a slow nsys, outside the budget), and a Python that lacks
an import the trainer needs gets one line per missing piece instead of a traceback per row."""
import json
import os
import sys

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
