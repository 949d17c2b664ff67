"""The course kit's data layouts read as they are (handler/data/dataset.py, cifar_images.py): the
PNG tree's labels come from its folder names, any mode's loader reads either layout, and a
folder the user named is never written into."""
import os

import pytest

from handler.data.dataset import prepare_dataset, read_splits
from handler.DDP.cifar10_loader import get_DDP_loader
from handler.runtime.errors import UserError
from handler.train.config import Config
from tests.lab.test_lab_kit import N_TEST, N_TRAIN, decoded_ids, write_layouts


def test_the_png_trees_folder_names_give_cifar10s_label_order(tmp_path, capsys):
    tree = write_layouts(tmp_path)["ddp_dali"]
    splits = read_splits(tree, valid_size=0, seed=0)
    # identity_images' label is its index % 10, written under CIFAR-10's name for that label
    images, labels = splits.train
    ids = images[:, 0, 0, 0].astype(int) + 256 * images[:, 0, 0, 1].astype(int)
    assert sorted(ids.tolist()) == list(range(N_TRAIN)) and (labels == ids % 10).all()
    assert splits.classes[:3] == ["airplane", "automobile", "bird"]
    assert "warning" not in capsys.readouterr().err


def test_other_class_names_are_warned_about_and_follow_their_sorted_order(tmp_path, capsys):
    tree = write_layouts(tmp_path)["ddp_dali"]
    for split in ("train", "test"):
        os.rename(os.path.join(tree, split, "airplane"), os.path.join(tree, split, "plane"))
    splits = read_splits(tree, valid_size=0, seed=0)
    assert splits.classes.index("plane") == 7  # bird ... horse, plane, ship, truck
    assert "label k is the k-th folder in sorted order" in capsys.readouterr().err


def test_the_ddp_loader_reads_the_png_tree_too_and_holds_out_valid_from_train(tmp_path):
    tree = write_layouts(tmp_path)["ddp_dali"]
    test, train, valid = get_DDP_loader(5, 4, root=tree, valid_size=8, cutout=0, download=False)
    seen = [i for images, _ in train for i in decoded_ids(images)]
    held = [i for images, _ in valid for i in decoded_ids(images)]
    assert sorted(seen + held) == list(range(N_TRAIN)) and len(held) == 8
    assert sorted(i for images, _ in test for i in decoded_ids(images)) == list(range(N_TRAIN, N_TRAIN + N_TEST))


def test_a_named_folder_with_neither_layout_is_one_line_naming_both(tmp_path):
    named = tmp_path / "mine"
    named.mkdir()
    (named / "notes.txt").write_text("not CIFAR")
    with pytest.raises(UserError) as err:
        prepare_dataset(Config(data=str(named)))
    message = str(err.value)
    assert "\n" not in message and "neither layout" in message
    assert "cifar-10-batches-py" in message and "DIR/train/<class>/<n>.png" in message
    assert os.listdir(named) == ["notes.txt"], "something was written into the named folder"
    with pytest.raises(UserError, match="neither layout"):
        get_DDP_loader(5, 4, root=str(named), download=False)


def test_the_lab_pipeline_reads_a_class_tree_with_dalis_labels_equal_to_ours(tmp_path):
    """CifarPipeline(data_dir, ...) as the lab builds it: fn.readers.file(file_root=...) numbers
    the class folders itself; its labels must be the ones the harness reads for the same files."""
    pytest.importorskip("nvidia.dali")
    from handler.DALI.cifar10_loader import CifarPipeline, DALIWrapper  # the kit's module names them
    tree = write_layouts(tmp_path)["ddp_dali"]
    loader = DALIWrapper(lambda epoch: CifarPipeline(os.path.join(tree, "train"), 8, False, 0, None, 0, 1, 1),
                         samples=N_TRAIN, batch=8)
    for _ in range(2):  # a second pass after the lab's reset()
        pairs = [(i, int(y)) for images, labels in loader for i, y in zip(decoded_ids(images), labels)]
        assert sorted(i for i, _ in pairs) == list(range(N_TRAIN)) and all(y == i % 10 for i, y in pairs)
        loader.reset()


def test_the_kits_command_line_parses_to_what_it_means():
    from handler.modes import all_modes
    from handler.train.config import parse_config
    kit = ["--num_gpu=2", "--data=dataset/cifar10", "--ckpt=runs/x", "--mode=ddp", "--save_ckpt", "--ip=127.0.0.2",
           "--port=29500", "--lr=0.05", "--decay=1e-4", "--seed=3"]
    cfg = parse_config(kit, all_modes(), cuda_count=0)
    assert (cfg.num_gpu, cfg.data, cfg.ckpt, cfg.mode, cfg.save) == (2, "dataset/cifar10", "runs/x", "ddp", "ckpt")
    assert (cfg.host, cfg.port, cfg.lr, cfg.weight_decay, cfg.seed) == ("127.0.0.2", 29500, 0.05, 1e-4, 3)
    with pytest.raises(UserError, match="--save_ckpt saves checkpoints and --save none saves nothing"):
        parse_config([*kit, "--save", "none"], all_modes(), cuda_count=0)


def test_decoded_pngs_are_cached_outside_the_tree_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    from PIL import Image
    from handler.data.cifar_images import list_split, read_split
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tree = write_layouts(tmp_path / "data")["ddp_dali"]
    split = list_split(os.path.join(tree, "test"), sorted(os.listdir(os.path.join(tree, "test"))))
    first, _ = read_split(split)
    assert len(os.listdir(tmp_path / "cache" / "cifar-harness" / "png_arrays")) == 1
    Image.new("RGB", (32, 32), (7, 7, 7)).save(split.files[0])
    os.utime(split.files[0], ns=(1, 1))  # a new time as well as new pixels
    again, _ = read_split(split)
    assert again[0, 0, 0].tolist() == [7, 7, 7] and (again[1:] == first[1:]).all()
    with open(split.files[1], "wb") as f:
        f.write(b"not a png")
    with pytest.raises(UserError, match="is not a readable image"):
        read_split(split)


@pytest.mark.parametrize("layout", ["ddp", "ddp_dali"])
def test_torchrun_workers_read_data_already_there_without_a_lock_file_in_its_folder(tmp_path, layout):
    from handler.data.dataset import data_lock
    folder = write_layouts(tmp_path)[layout]
    before = sorted(os.listdir(folder))
    with data_lock(Config(data=folder, dataset="auto")):
        pass
    assert sorted(os.listdir(folder)) == before
