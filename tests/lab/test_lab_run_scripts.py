"""The course kit's run flow on a machine without a GPU: scripts/run_ddp_dali.sh, unchanged, runs
scripts/launch.sh twice with the kit's settings and trains on the PNG tree DATA_DIR names
(never on a synthetic set, and writing nothing into it)."""
import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_process
from tests.lab.test_lab_kit import identity_images
from handler.data.synthetic import CLASSES

N_TRAIN, N_TEST = 110, 20  # a tree this small gets the default hold-out of a tenth: one step an epoch


def write_tree(root):
    from PIL import Image
    for split, (images, labels), first in (("train", identity_images(0, N_TRAIN), 0),
                                           ("test", identity_images(N_TRAIN, N_TEST), N_TRAIN)):
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{first + i}.png")
    (root / "valid").mkdir()


@pytest.mark.slow  # a training run through the kit's script for one check: CI's slow step (pytest.ini)
def test_the_kits_run_script_trains_on_data_dir_and_writes_the_kits_layout(tmp_path):
    for name in ("scripts", "handler", "models", "train_cifar.py"):  # a checkout whose outputs land in tmp_path
        os.symlink(ROOT / name, tmp_path / name)
    write_tree(tmp_path / "dataset" / "cifar10_images")
    before = sorted(p for p in (tmp_path / "dataset").rglob("*"))
    run = run_process(["bash", "scripts/run_ddp_dali.sh"], cwd=tmp_path, budget=60,
                      env={"PROFILE": "0", "PYTHON": sys.executable, "TIMESTAMP": "t0"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for gpus in (1, 2):
        metrics = json.loads((tmp_path / "nsight_logs" / "ddp_dali_t0" / f"gpu_{gpus}.metrics.json").read_text())
        assert metrics["env"]["dataset"] == "cifar10" and not metrics["env"]["dataset_fallback"]
        assert metrics["config"]["dali_source"] == "files"
        assert metrics["config"]["valid_size"] == N_TRAIN // 10, "a DATA_DIR tree keeps the default hold-out"
        assert (tmp_path / "runs" / "ddp_dali_t0" / f"gpu_{gpus}" / "last.pt").is_file()
    assert sorted(p for p in (tmp_path / "dataset").rglob("*")) == before, "something was written into DATA_DIR"
    assert np.isfinite(metrics["test"]["acc"])
