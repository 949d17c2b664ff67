"""Shared fixtures: small datasets in the real CIFAR layout, and running the CLI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handler.common.devices import cuda_status  # noqa: E402
from handler.common.synthetic import write_synthetic  # noqa: E402

# A small synthetic set: learnable in 2 epochs of resnet20, sizes deliberately not
# divisible by the world sizes and batch sizes the tests use.
N_TRAIN, N_TEST = 1201, 301
SMALL = ["--dataset", "synthetic", "--synthetic-train", str(N_TRAIN), "--synthetic-test", str(N_TEST),
         "--model", "resnet20", "--workers", "0", "--no-progress"]


def pytest_collection_modifyitems(config, items):
    if cuda_status()[0]:
        return
    skip = pytest.mark.skip(reason=f"needs CUDA: {cuda_status()[1] or 'no GPU visible'}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A --data folder whose synthetic dataset is already generated."""
    root = tmp_path_factory.mktemp("data")
    write_synthetic(str(root / f"synthetic_{N_TRAIN}x{N_TEST}"), N_TRAIN, N_TEST)
    return root


def run_cli(args, *, cwd=ROOT, env=None, timeout=240, cmd=None):
    """Run train_cifar.py (or cmd) in a fresh process; returns CompletedProcess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    command = cmd or [sys.executable, str(ROOT / "train_cifar.py")]
    return subprocess.run([*command, *map(str, args)], cwd=cwd, env=full_env, timeout=timeout,
                          capture_output=True, text=True)


def error_lines(proc) -> list:
    """stderr lines that are not the machine's CUDA note."""
    return [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("note:")]


def read_metrics(path) -> dict:
    with open(path) as f:
        return json.load(f)
