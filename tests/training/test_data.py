"""The CIFAR layout reader, the split, the synthetic set and the download fallback."""
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from handler.data.augment import MEAN, PAD, STD, Cutout, eval_transform, train_transform
from handler.data.cifar_files import FOLDER, read_cifar
from handler.train.config import Config
from handler.data.dataset import prepare_dataset, split_indices
from handler.runtime.errors import UserError
from tests.conftest import read_metrics, run_cli


def write_by_hand(root, sizes, n_test, classes):
    """A CIFAR-layout folder written the way the original (bytes keys) files are."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, n in enumerate(sizes, 1):
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": list(rng.integers(0, len(classes), n))}
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((n_test, 3072), np.uint8),
                                                      b"labels": [0] * n_test}))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [c.encode() for c in classes]}))
    return folder


def test_reader_accepts_a_hand_made_folder_with_non_standard_batch_sizes(tmp_path):
    write_by_hand(tmp_path, [3, 17, 1, 250, 9], n_test=7, classes=["cat", "dog", "emu"])
    data = read_cifar(str(tmp_path))
    assert data.train_x.shape == (280, 32, 32, 3) and data.train_x.dtype == np.uint8
    assert data.test_x.shape == (7, 32, 32, 3)
    assert data.classes == ["cat", "dog", "emu"]
    assert data.train_y.max() < 3


def test_reader_keeps_cifar_channel_order(tmp_path):
    folder = write_by_hand(tmp_path, [1, 1, 1, 1, 1], n_test=1, classes=["a"])
    flat = np.zeros((1, 3072), np.uint8)
    flat[0, :1024] = 200  # the red plane comes first on disk
    (folder / "data_batch_1").write_bytes(pickle.dumps({"data": flat, "labels": [0]}))
    img = read_cifar(str(tmp_path)).train_x[0]
    assert (img[..., 0] == 200).all() and (img[..., 1:] == 0).all()


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_corrupt_batch_file_is_named_in_one_line(tmp_path, damage):
    folder = write_by_hand(tmp_path, [5] * 5, n_test=3, classes=["a", "b"])
    path = folder / "data_batch_3"
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2] if damage == "truncate" else b"not a pickle" * 10)
    with pytest.raises(UserError, match="data_batch_3 is truncated or corrupt"):
        read_cifar(str(tmp_path))


DAMAGE = {  # what is written over one file -> the one line that names it
    "missing": ("data_batch_2", None, "data_batch_2 is missing"),
    "no dict": ("data_batch_2", [1, 2], "not a CIFAR batch"),
    "no data": ("data_batch_2", {"labels": [0]}, "has no 'data'/'labels' entries"),
    "bad shape": ("data_batch_2", {"data": np.zeros((2, 100), np.uint8), "labels": [0, 0]}, "holds data of shape"),
    "bad label": ("data_batch_2", {"data": np.zeros((1, 3072), np.uint8), "labels": [7]}, "labels outside 0..1"),
    "no classes": ("batches.meta", {"num_vis": 3072}, "has no label_names"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_malformed_cifar_file_is_named_in_one_line(tmp_path, damage):
    folder = write_by_hand(tmp_path, [5] * 5, n_test=3, classes=["a", "b"])
    name, content, message = DAMAGE[damage]
    if content is None:
        (folder / name).unlink()
    else:
        (folder / name).write_bytes(pickle.dumps(content))
    with pytest.raises(UserError, match=message):
        read_cifar(str(tmp_path))


def test_a_single_training_image_is_a_clear_error(tmp_path):
    write_by_hand(tmp_path, [1, 0, 0, 0, 0], n_test=3, classes=["a", "b"])
    with pytest.raises(UserError, match="holds 1 training image"):
        read_cifar(str(tmp_path))


def test_zero_test_images_is_a_clear_error(tmp_path):
    write_by_hand(tmp_path, [5] * 5, n_test=0, classes=["a", "b"])
    with pytest.raises(UserError, match="test_batch holds no images"):
        read_cifar(str(tmp_path))


def test_split_is_deterministic_disjoint_and_complete():
    train, valid = split_indices(1000, 100, seed=3)
    again_train, again_valid = split_indices(1000, 100, seed=3)
    assert np.array_equal(train, again_train) and np.array_equal(valid, again_valid)
    assert len(valid) == 100 and set(train).isdisjoint(valid) and len(train) + len(valid) == 1000
    assert not np.array_equal(split_indices(1000, 100, seed=4)[1], valid)


def test_valid_size_not_below_train_size_is_a_clear_error():
    with pytest.raises(UserError, match="--valid-size 1000 leaves no training images"):
        split_indices(1000, 1000, seed=0)


def test_auto_falls_back_to_synthetic_loudly_and_never_writes_into_the_real_folder(tmp_path, monkeypatch, capsys):
    import handler.data.cifar_files as files
    monkeypatch.setattr(files, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # nothing listens
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = tmp_path / "data"
    cfg = prepare_dataset(Config(data=str(data), dataset="auto", synthetic_train=50, synthetic_test=10))
    assert cfg.dataset == "synthetic"
    assert "SYNTHETIC" in capsys.readouterr().err
    assert not (data / FOLDER).exists()
    assert cfg.dataset_dir.startswith(str(tmp_path / "cache")), "the fallback set went into the named folder"
    assert read_cifar(cfg.dataset_dir).train_x.shape[0] == 50


def test_a_run_whose_auto_dataset_fell_back_to_synthetic_says_so_in_its_metrics(tmp_path, two_epoch_run):
    """env.dataset alone reads the same for an asked-for synthetic set (docs/METRICS.md)."""
    tiny = ["--mode", "dp", "--num_gpu", "1", "--epochs", "1", "--model", "resnet20", "--batch-size", "32",
            "--synthetic-train", "64", "--synthetic-test", "32", "--valid-size", "0", "--workers", "0",
            "--no-progress", "--save", "none", "--dataset", "auto", "--data", tmp_path / "data",
            "--ckpt", tmp_path / "ckpt", "--metrics", tmp_path / "metrics.json"]
    dead = {"CIFAR10_URL": "http://127.0.0.1:9/cifar-10-python.tar.gz"}  # nothing listens
    run = run_cli(tiny, env=dead, budget=15)
    assert run.returncode == 0, run.stderr[-2000:]
    fell_back = read_metrics(tmp_path / "metrics.json")["env"]
    _, folder = two_epoch_run("dp")  # --dataset synthetic: asked for
    asked = read_metrics(folder / "metrics.json")["env"]
    assert fell_back["dataset"] == asked["dataset"] == "synthetic"
    assert asked["dataset_fallback"] is None and not any("SYNTHETIC" in note for note in asked["notes"])
    assert "Connection refused" in fell_back["dataset_fallback"]  # the reason: the download that failed
    assert any(note.startswith("--dataset auto ran SYNTHETIC data: ") for note in fell_back["notes"])


def test_cifar10_offline_without_data_is_a_clear_error(tmp_path, monkeypatch):
    import handler.data.cifar_files as files
    monkeypatch.setattr(files, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    with pytest.raises(UserError, match="could not be downloaded.*--dataset synthetic"):
        prepare_dataset(Config(data=str(tmp_path / "missing"), dataset="cifar10"))


@pytest.mark.parametrize("cutout", [0, 8])
def test_the_transforms_equal_torchvisions_bit_for_bit_with_the_same_random_draws(cutout):
    import torchvision.transforms as T
    normalise = [T.ToTensor(), T.Normalize(MEAN, STD)]
    train = T.Compose([T.RandomCrop(32, padding=PAD), T.RandomHorizontalFlip(), *normalise,
                       *([Cutout(cutout)] if cutout else [])])
    images = np.random.default_rng(1).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    for ours, theirs in ((train_transform(cutout), train), (eval_transform(), T.Compose(normalise))):
        torch.manual_seed(7)
        mine, after_mine = torch.stack([ours(im) for im in images]), torch.get_rng_state()
        torch.manual_seed(7)
        reference = torch.stack([theirs(Image.fromarray(im)) for im in images])
        assert mine.dtype == torch.float32 and mine.shape == (64, 3, 32, 32)
        assert torch.equal(mine, reference)
        assert torch.equal(after_mine, torch.get_rng_state())  # the same draws, so runs resume alike


def test_training_processes_never_import_torchvision():
    """It costs each process 1.7 s (torch._dynamo via torchvision.ops); only the CIFAR download
    and compare's provenance import it, when they run."""
    import subprocess
    import sys
    code = ("import sys, train_cifar, handler.modes, handler.DDP.cifar10_loader, handler.PP.loader, "
            "handler.train.metrics; print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_successful_download_resolves_auto_to_the_real_cifar10(tmp_path, monkeypatch):
    # The network is the boundary (none here): the stand-in writes the layout a download would.
    import handler.data.dataset as dataset
    from handler.data.cifar_files import write_cifar
    x = np.zeros((10, 32, 32, 3), np.uint8)
    monkeypatch.setattr(dataset, "download_cifar",
                        lambda root: write_cifar(root, x, np.arange(10) % 2, x[:2], np.zeros(2), ["a", "b"]))
    cfg = prepare_dataset(Config(data=str(tmp_path), dataset="auto"))
    assert cfg.dataset == "cifar10" and read_cifar(str(tmp_path)).train_x.shape[0] == 10
