"""The kit's data as a new user gets it wrong (issues 39 and 41), each run through the trainer
on a small PNG tree or path in a temporary folder: the default hold-out on a small set, a class
with no training images, a class missing from train/, and --data naming a file."""
import json
import shutil

import numpy as np

import pytest

from handler.data.synthetic import CLASSES
from handler.runtime.errors import UserError
from handler.train.config import Config
from tests.conftest import run_cli
from tests.training.test_cli_errors import fails_with_one_line

PER_CLASS_TRAIN, PER_CLASS_TEST = 4, 2  # 40 training and 20 test images
TINY = ["--epochs", "1", "--model", "resnet20", "--workers", "0", "--batch-size", "8", "--no-progress"]
BUDGET = 25  # s, one dp epoch of resnet20 on 40 images, start-up included (see tests/conftest.py SLACK)


def write_tree(root):
    """DIR/{train,valid,test}/<class>/<n>.png with CIFAR-10's names, valid/ empty as the kit leaves it."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, per_class in (("train", PER_CLASS_TRAIN), ("test", PER_CLASS_TEST)):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    (root / "valid").mkdir()
    return root


def kit_command(tree, ckpt, *extra):
    """The kit's train_cifar.py command line, made small for a CPU (TINY)."""
    return ["--num_gpu=1", f"--data={tree}", f"--ckpt={ckpt}", "--mode=dp", "--save_ckpt", "--ip=127.0.0.1",
            "--lr=0.05", "--decay=1e-4", "--seed=3", *TINY, *extra]


def train(tmp_path, tree, *extra):
    proc = run_cli(kit_command(tree, tmp_path / "ckpt", *extra), budget=BUDGET,
                   env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    metrics = tmp_path / "ckpt" / "metrics.json"
    return proc, json.loads(metrics.read_text()) if metrics.exists() else None


@pytest.mark.slow  # 60 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_the_kits_command_on_a_small_tree_holds_out_a_tenth_and_says_so(tmp_path):
    tree = write_tree(tmp_path / "tree")
    proc, metrics = train(tmp_path, tree)
    assert proc.returncode == 0, proc.stderr
    note = [line for line in proc.stderr.splitlines() if "--valid-size not given" in line]
    assert len(note) == 1 and note[0].startswith("note: ") and "a tenth (4)" in note[0], proc.stderr
    assert metrics["config"]["valid_size"] == 4, "the metrics must record the hold-out used"
    assert metrics["epochs"][0]["val_samples"] == 4 and metrics["epochs"][0]["train_samples"] == 36
    assert any("a tenth (4)" in n for n in metrics["env"]["notes"])


def test_an_explicit_valid_size_too_large_for_the_set_keeps_its_one_line_error(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree")
    line = fails_with_one_line(kit_command(tree, tmp_path / "ckpt", "--valid-size", "5000"), capsys)
    assert line == "error: --valid-size 5000 leaves no training images (the training set has 40); use less than 40, or 0"


@pytest.mark.slow  # 51 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_class_with_no_training_images_and_one_missing_from_train_are_named(tmp_path):
    """train/deer/ empty (test/deer/ full): warned by name; train/horse/ gone (test/horse/ there):
    its test images are named as left out, in the warning and in the metrics."""
    tree = write_tree(tmp_path / "tree")
    for png in (tree / "train" / "deer").iterdir():
        png.unlink()
    shutil.rmtree(tree / "train" / "horse")
    proc, metrics = train(tmp_path, tree, "--valid-size", "0")
    assert proc.returncode == 0, proc.stderr
    deer = [line for line in proc.stderr.splitlines() if line.startswith("warning: class deer")]
    assert len(deer) == 1 and "has no training images" in deer[0], proc.stderr
    assert "its 2 test images count as misses" in deer[0]
    horse = [line for line in proc.stderr.splitlines() if line.startswith("warning: class horse")]
    assert len(horse) == 1 and "its 2 test images" in horse[0] and "left out" in horse[0], proc.stderr
    assert metrics["test"]["samples"] == 18, "horse's 2 test images are left out, deer's 2 are tested"
    assert metrics["env"]["left_out"] == {"test/horse": 2}
    notes = metrics["env"]["notes"]
    assert any("class deer has no training images" in n for n in notes)
    assert any("class horse has no folder" in n for n in notes)


def test_data_naming_a_file_is_one_line_before_any_download_or_fallback(tmp_path, capsys, monkeypatch):
    import handler.data.dataset as dataset
    named = tmp_path / "cifar.tar.gz"
    named.write_bytes(b"not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # The network is the boundary: a download tried at all fails the test.
    monkeypatch.setattr(dataset, "download_cifar", lambda root: (_ for _ in ()).throw(AssertionError("downloaded")))
    line = fails_with_one_line(["--data", named, "--ckpt", tmp_path / "ckpt", *TINY], capsys)
    assert line == (f"error: --data {named} is a file, not a folder: point --data (DATA_DIR) at "
                    "torchvision's CIFAR-10 folder (DIR/cifar-10-batches-py/data_batch_1..5, "
                    "test_batch) or the PNG tree (DIR/train/<class>/<n>.png, DIR/test/...), or at "
                    "an empty or new folder to download CIFAR-10 into")
    assert not (tmp_path / "cache").exists(), "a synthetic fallback was made"
    assert named.read_bytes() == b"not a folder"
    with pytest.raises(UserError, match="is a file, not a folder"):  # torchrun's workers meet it here
        with dataset.data_lock(Config(data=str(named))):
            pass
