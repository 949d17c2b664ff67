"""handler.compare says what data a comparison trained on, and only what it knows: a folder in
CIFAR-10's layout is "real CIFAR-10" only where torchvision's own checksums of CIFAR-10's files
match (torchvision.datasets.CIFAR10's train_list/test_list, check_integrity); otherwise the page
names the folder and its image count. Nothing is downloaded."""
import hashlib

from handler.compare.cells import Cell, Variant
from handler.compare.provenance import dataset_identity
from handler.compare.results import dataset_description
from handler.compare.runner import Outcome
from handler.data.cifar_files import FOLDER, TEST_FILE, TRAIN_FILES
from handler.data.synthetic import write_synthetic
from tests.lab.test_lab_trees import write_tree


def _ran_on(folder) -> Outcome:
    return Outcome(Cell(Variant("ddp", "ddp"), 1), "ok",
                   metrics={"env": {"dataset": "cifar10"}, "config": {"data": str(folder) if folder else None}})


def test_a_folder_in_cifar10s_layout_that_is_not_cifar10_is_named_with_its_image_count_not_called_real(tmp_path):
    write_synthetic(str(tmp_path / "lookalike"), 50, 10)  # the CIFAR layout, files that are not CIFAR-10's
    said = dataset_description([_ran_on(tmp_path / "lookalike")])
    assert "real CIFAR-10" not in said
    assert said == (f"cifar10: {tmp_path / 'lookalike'}: 60 images in CIFAR-10's layout, NOT CIFAR-10's files "
                    f"({', '.join((*TRAIN_FILES, TEST_FILE))} differ from torchvision's checksums)")


def test_files_whose_md5s_are_torchvisions_are_named_real_cifar10(tmp_path, monkeypatch):
    """CIFAR-10 itself (170 MB) cannot be downloaded here: torchvision's list of md5s is pointed at the tiny
    files' own, so the match path runs; one file changed by a byte no longer matches."""
    from torchvision.datasets import CIFAR10
    write_synthetic(str(tmp_path / "data"), 20, 5)
    folder = tmp_path / "data" / FOLDER

    def md5(name):
        return hashlib.md5((folder / name).read_bytes()).hexdigest()
    monkeypatch.setattr(CIFAR10, "train_list", [[n, md5(n)] for n in TRAIN_FILES])
    monkeypatch.setattr(CIFAR10, "test_list", [[TEST_FILE, md5(TEST_FILE)]])
    assert dataset_identity(str(tmp_path / "data")) == f"real CIFAR-10 ({tmp_path / 'data'}: 25 images; torchvision's checksums match)"
    (folder / TEST_FILE).write_bytes((folder / TEST_FILE).read_bytes() + b"\0")
    assert "NOT CIFAR-10's files (test_batch differs" in dataset_identity(str(tmp_path / "data"))


def test_a_png_tree_is_named_with_its_image_count_and_not_checked_as_cifar10(tmp_path):
    tree = write_tree(tmp_path / "tree")
    said = dataset_identity(str(tree))
    assert said.startswith(f"{tree}: 60 images in a PNG tree of CIFAR-10's layout") and "real" not in said


def test_a_run_whose_folder_was_not_recorded_or_is_gone_is_not_called_real(tmp_path):
    assert "real CIFAR-10" not in dataset_description([_ran_on(None)])
    assert "not found here" in dataset_identity(str(tmp_path / "gone"))
