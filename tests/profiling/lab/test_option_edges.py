"""Issue 57's option edges as a student meets them: compare's --extra, --modes and --timeout, a bench's
--from of an interrupted or older matrix, JSON nested past reading, a prefix of an option, a path that
starts with `-` in launch.sh's settings. Each is one line naming the problem and the fix (exit 2), or a
sane answer said so; the entry points run in-process through their own one_line_errors."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from handler.compare.__main__ import parse_args as compare_args
from tests.nsys_helpers import REPO
from tests.profiling.lab.test_report_edges import GOOD, _exits, one_line, run
from handler.runtime.errors import one_line_errors


def parser_line(status: int, err: str, prog: str) -> str:
    """The parser's own one line: `python -m X: argument --flag: ... (see --help)`, exit 2."""
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"python -m {prog}: "), err
    assert err.strip().endswith("(see --help)"), err
    return err.strip()


@pytest.mark.parametrize("argv, says", [
    (["--modes", "ddp", "--extra", "--label 'my run"], "compare: --extra \"--label 'my run\" cannot be split into "
                                                       "options (No closing quotation: a quote is not closed"),
    (["--cell", "ddp:--label 'x"], "compare: --cell \"ddp:--label 'x\" cannot be split into options (No closing"),
    (["--modes", "nope"], "compare: --modes: 'nope' is not a mode; name modes among "),
], ids=["--extra unclosed", "--cell unclosed", "--modes names no mode"])
def test_compares_unsplittable_arguments_and_unknown_modes_are_one_line_naming_the_flag_typed(
        tmp_path, monkeypatch, capsys, argv, says):
    """Before: `ValueError: No closing quotation`, a traceback; `--modes nope` named `--cell 'nope'`."""
    monkeypatch.chdir(tmp_path)
    status, _, err = run("compare", [*argv, "--profile", "0"], capsys)
    line = one_line(status, err, "compare")
    assert line.startswith(says) and "--cell 'nope'" not in line, line
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("value, says", [("-5", "-5 is negative"), ("nan", "'nan' is not a finite number"),
                                         ("inf", "'inf' is not a finite number"), ("soon", "'soon' is not a number")])
def test_a_compare_timeout_that_is_not_seconds_is_one_line_and_zero_stays_no_limit(capsys, value, says):
    """Before: --timeout -5 killed every cell at once ("timed out after -5 s"), nan was no limit, silently."""
    status, _, err = run("compare", ["--timeout", value, "--modes", "ddp"], capsys)
    assert f"argument --timeout: {says}; give seconds, 0 or more (0: no limit)" in parser_line(status, err, "handler.compare")
    assert compare_args(["--timeout", "0"]).timeout == 0 and compare_args(["--timeout", "90"]).timeout == 90


def _bench(module: str, argv: list, capsys) -> tuple[int, str, str]:
    import importlib
    with _exits() as code, one_line_errors(module):
        importlib.import_module(module).main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code.value, out, err


def _matrix_folder(tmp_path: Path, text: str) -> Path:
    (tmp_path / "m" / "compare").mkdir(parents=True)
    (tmp_path / "m" / "compare" / "results.json").write_text(text)
    return tmp_path / "m"


def test_bench_cores_matrix_from_an_interrupted_matrix_is_one_line(tmp_path, capsys):
    """Before: `JSONDecodeError`, a traceback."""
    folder = _matrix_folder(tmp_path, '{"cells": [{"name": "dp x1", "status": "ok", "measu')
    status, _, err = _bench("bench.cores_matrix", ["--from", folder], capsys)
    line = one_line(status, err, "bench.cores_matrix")
    assert f"--from {folder}/compare/results.json is not JSON (" in line and "damaged or cut off" in line
    assert line.endswith("run the matrix again with `python -m bench.cores_matrix --out DIR` and pass that DIR")


def test_bench_cores_matrix_from_an_older_compares_results_says_not_recorded(tmp_path, capsys):
    """An older compare wrote no measured_epoch_s: before, `TypeError` formatting None."""
    cells = [{"name": "ddp x1", "status": "ok", "mode": "ddp", "count": 1, "epoch_s": 2.0},
             {"name": "ddp x2", "status": "failed", "mode": "ddp", "count": 2}]
    folder = _matrix_folder(tmp_path, json.dumps({"cells": cells}))
    status, out, _ = _bench("bench.cores_matrix", ["--from", folder], capsys)
    assert status == 0
    assert "| ddp x1 | not recorded |" in out and "| ddp x2 | failed |" in out and "No cell was predicted." in out


DEEP = "[" * 100_000


@pytest.mark.parametrize("entry", ["whatif", "report --metrics", "whatif --link", "bench.whatif", "bench.cores_matrix",
                                   "compare --comm-bench"])
def test_json_nested_past_reading_is_one_line_at_every_reader(tmp_path, capsys, entry):
    """100,000 nested brackets: before, `RecursionError`, a traceback (the readers caught ValueError only)."""
    deep = tmp_path / "x.summary.json"
    deep.write_text(DEEP)
    summary = tmp_path / "ok.summary.json"
    summary.write_text(json.dumps({"schema": 1}))
    if entry == "whatif":
        status, _, err = run("whatif", [deep], capsys)
    elif entry == "whatif --link":
        status, _, err = run("whatif", [summary, "--link", deep], capsys)
    elif entry == "report --metrics":
        status, _, err = run("report", [GOOD, "--metrics", deep, "--out", tmp_path / "out"], capsys)
    elif entry == "bench.whatif":
        status, _, err = _bench("bench.whatif", ["--from-results", deep], capsys)
    elif entry == "bench.cores_matrix":
        status, _, err = _bench("bench.cores_matrix", ["--from", _matrix_folder(tmp_path, DEEP)], capsys)
    else:
        status, _, err = run("compare", ["--comm-bench", deep, "--modes", "ddp", "--profile", "0",
                                         "--out", tmp_path / "cmp"], capsys)
    line = one_line(status, err, entry.split()[0])
    assert "nests its brackets too deep to read" in line or "is not a bench.comm result" in line, line


@pytest.mark.parametrize("module, argv, prefix", [
    ("handler.profiling.whatif", ["x.summary.json", "--gp", "1,4"], "--gp"),
    ("handler.profiling.report", ["x.sqlite", "--met", "m.json"], "--met"),
    ("bench.cores_matrix", ["--fr", "DIR"], "--fr"),
    pytest.param("handler.compare", ["--time", "5"], "--time", marks=pytest.mark.slow),  # 14 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
])
def test_a_prefix_of_an_option_is_named_never_taken_for_it(module, argv, prefix):
    """Before: `--gp` was `--gpus`, `--met` `--metrics`, `--fr` `--from`: a typo guessed, not named."""
    done = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    line = done.stderr.strip()
    assert done.returncode == 2 and len(line.splitlines()) == 1 and "unrecognized arguments: " + prefix in line, line


def test_train_cifars_and_gpu_checks_parsers_name_a_prefix_too():
    from handler.modes import parse_config
    from handler.runtime.errors import UserError
    from scripts.gpu_check import arguments
    with pytest.raises(UserError, match="unrecognized arguments: --epoch 1"):
        parse_config(["--epoch", "1"], cuda_count=0)
    with pytest.raises(SystemExit):
        arguments(["--bud", "5"])


def test_every_argument_parser_in_the_repository_takes_no_prefix_of_an_option():
    """Each ArgumentParser(...) passes allow_abbrev=False, and each subclass sets it in its __init__."""
    missing = []
    for path in [REPO / "train_cifar.py", *(p for top in ("handler", "bench", "scripts") for p in (REPO / top).rglob("*.py"))]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "ArgumentParser":
                ok = any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
                         for k in node.keywords)
                missing += [] if ok else [f"{path.relative_to(REPO)}:{node.lineno}"]
            if isinstance(node, ast.ClassDef) and any(getattr(b, "attr", getattr(b, "id", "")) == "ArgumentParser"
                                                      for b in node.bases):
                init = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
                if not init or "allow_abbrev" not in ast.unparse(init[0]):
                    missing.append(f"{path.relative_to(REPO)}:{node.lineno} class {node.name}")
    assert not missing, missing


def test_launch_passes_setting_paths_that_start_with_a_dash_as_values(tmp_path):
    """`DATA_DIR=-data`: before, "argument --data: expected one argument", naming neither DATA_DIR nor the
    folder. Now the paths reach train_cifar.py as values (here it stops at --epochs 0, its own line)."""
    env = {**os.environ, "DATA_DIR": "-data", "NSIGHT_LOG_DIR": "-logs", "CKPT_DIR": "-ckpt", "MODE": "ddp",
           "NUM_GPUS": "1", "PROFILE": "0", "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(REPO / "scripts" / "launch.sh"), "--epochs", "0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "expected one argument" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: --epochs 0: train for at least 1 epoch", done.stderr
    assert (tmp_path / "-logs").is_dir()


@pytest.mark.parametrize("argv, says", [
    (["--rates", "1000,nan"], "bench.comm: --rates '1000,nan' is not a list of Mbit/s above 0"),
    (["--delays", "-1"], "bench.comm: --delays '-1' is not a list of ms each way, 0 or more"),
    (["--steps", "0"], "argument --steps: 0 is less than 1; give 1 or more"),
    (["--gpu-epoch-s", "inf"], "argument --gpu-epoch-s: 'inf' is not a finite number; give a number above 0"),
])
def test_a_benchs_numeric_option_that_is_negative_nan_or_infinite_is_one_line_before_any_run(capsys, argv, says):
    status, _, err = _bench("bench.comm", argv, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and says in err, err


def test_launch_refuses_a_file_name_its_files_could_not_have_before_any_run(tmp_path):
    """NSIGHT_FILE_NAME of 130 two-byte letters (260 bytes): before, nsys wrote no report, and the export's
    `File name too long` came after the whole training."""
    env = {**os.environ, "NSIGHT_FILE_NAME": "\u00fc" * 130, "PROFILE": "0", "MODE": "ddp", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "scripts" / "launch.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == (
        "launch: NSIGHT_FILE_NAME is 260 bytes long; its files (NAME.summary.json, NAME.partial.sqlite) would pass "
        "the file system's 255: name it in 240 or fewer") and not any(tmp_path.iterdir())
