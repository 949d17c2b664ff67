"""Numeric options and --metrics are checked before any process starts: one line each, and
no file that is not ours is ever replaced."""
import dataclasses
import json

import pytest
import torch

from handler.modes import all_modes, parse_config, preflight
from handler.train.config import SHARED_SECTIONS, mode_sections
from tests.conftest import SMALL
from tests.training.test_cli_errors import fails_with_one_line


@pytest.mark.parametrize("argv,expected", [
    # --momentum nan once trained, then stopped at step 1 blaming --lr.
    (["--momentum", "nan"], "--momentum nan: use a finite number in [0, 1)"),
    (["--momentum", "1"], "--momentum 1: use a finite number in [0, 1)"),
    (["--weight-decay", "-0.1"], "--weight-decay -0.1: use a finite number at least 0"),
    (["--lr", "inf"], "--lr inf: the learning rate must be a positive finite number"),
    (["--lr", "0"], "--lr 0: the learning rate must be a positive finite number"),
    (["--dist-timeout", "nan"], "--dist-timeout nan: use a positive number of seconds"),
    (["--dist-timeout", "0"], "--dist-timeout 0: use a positive number of seconds"),
    (["--bucket-cap-mb=-inf"], "--bucket-cap-mb -inf: use a positive size in MB"),
    (["--workers", "-1"], "--workers -1: use a whole number at least 0"),
    (["--seed", "-1"], "--seed -1: use a seed of 0 or more"),
    (["--port", "70000"], "--port 70000: use 1..65535, or 0 for a free port"),
    (["--mode", "pp", "--microbatches", "0"], "--microbatches 0: use a whole number at least 1"),
    (["--mode", "ddp", "--comm-hook", "powersgd", "--powersgd-warmup", "1"], "--powersgd-warmup 1: torch's PowerSGD"),
])
def test_a_numeric_option_out_of_its_range_gets_one_line_naming_it(argv, expected, capsys):
    assert expected in fails_with_one_line(argv, capsys)


def test_every_numeric_option_declares_its_range():
    """num_gpu is resolved from the machine first and checked there (config._resolve_num_gpu)."""
    unchecked = [f.name for section in (*SHARED_SECTIONS, *mode_sections(all_modes()))
                 for f in dataclasses.fields(section)
                 if "flags" in f.metadata and type(f.default) in (int, float) and "within" not in f.metadata]
    assert unchecked == ["num_gpu"]


@pytest.mark.parametrize("content", [b"not json", b'{"epochs": []}', None])
def test_a_metrics_path_holding_something_else_is_refused_and_left_as_it_was(tmp_path, capsys, content):
    other = tmp_path / "B"
    other.mkdir()
    target = other / "last.pt"
    if content is None:  # another run's checkpoint
        torch.save({"epoch": 3, "model": {"w": torch.ones(2)}}, target)
    else:
        target.write_bytes(content)
    before = target.read_bytes()
    line = fails_with_one_line(["--ckpt", tmp_path / "A", "--metrics", target, *SMALL], capsys)
    assert f"--metrics {target} already exists and is not a metrics file of this harness" in line
    assert target.read_bytes() == before


def test_a_metrics_path_holding_our_own_metrics_is_taken(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text(json.dumps({"schema": 1, "config": {}, "env": {}, "epochs": [], "test": None}))
    cfg = parse_config(["--ckpt", str(tmp_path / "A"), "--metrics", str(target), *SMALL], cuda_count=0)
    assert preflight(cfg, spawning=False).metrics == str(target)
