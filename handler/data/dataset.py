"""Which dataset a run uses, getting it onto disk, and the train/valid/test split."""
import dataclasses
import fcntl
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..runtime import rank0
from .cifar_files import FOLDER, CifarArrays, download_cifar, has_layout, read_cifar
from .cifar_images import SPLITS, has_image_tree, list_split, read_split, tree_classes, tree_warnings
from ..runtime.errors import UserError
from .synthetic import write_synthetic

Arrays = Tuple[np.ndarray, np.ndarray]  # (uint8 NHWC images, int64 labels)


@dataclass(frozen=True)
class Splits:
    train: Arrays
    valid: Arrays
    test: Arrays
    classes: List[str]
    # The PNG tree's files behind train/valid/test, in the arrays' order (None: torchvision's folder).
    files: Optional[Tuple[List[str], List[str], List[str]]] = None
    valid_size: int = 0  # --valid-size as applied: `hold_out`'s choice when it was not given
    # What the run must be told (printed and kept in the metrics' env.notes), and the PNG
    # tree's images that no class of train/ labels ({"test/horse": 12}; env.left_out).
    notes: Tuple[str, ...] = ()
    left_out: Dict[str, int] = field(default_factory=dict)


LAYOUTS = (f"torchvision's CIFAR-10 folder (DIR/{FOLDER}/data_batch_1..5, test_batch) or the PNG tree "
           "(DIR/train/<class>/<n>.png, DIR/test/...)")


DEFAULT_VALID = 5000  # --valid-size when not given, on a training set larger than it
DEFAULT_DATA = "./data"  # the repository's own data folder; any other --data is one the user named


def named(data: str) -> bool:
    """--data names a folder of the user's: nothing but an allowed download is written into it."""
    return data != DEFAULT_DATA


def neither_layout(root: str) -> UserError:
    return UserError(f"{root} holds neither layout: point --data (DATA_DIR) at {LAYOUTS}")


def not_a_folder(root: str) -> None:
    """A path that is a file, not a folder: nothing can be read from or downloaded into it."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"--data {root} is a file, not a folder: point --data (DATA_DIR) at {LAYOUTS}, "
                        "or at an empty or new folder to download CIFAR-10 into")


def has_cifar(root: str) -> bool:
    """root holds CIFAR-10 in either layout."""
    return has_layout(root) or has_image_tree(root)


def prepare_dataset(cfg):
    """Make sure the chosen dataset is on disk; return cfg with `dataset` resolved.

    Run by rank 0 alone (or before spawning); other ranks only read afterwards.
    """
    not_a_folder(cfg.data)
    if cfg.dataset == "synthetic":
        return _synthetic(cfg, reason=None)
    if has_cifar(cfg.data):
        return dataclasses.replace(cfg, dataset="cifar10")
    if named(cfg.data) and os.path.isdir(cfg.data) and os.listdir(cfg.data):
        raise neither_layout(cfg.data)  # a folder the user named: never download or generate into it
    rank0.say(cfg, f"CIFAR-10 not found under {cfg.data}; downloading it (about 170 MB)...")
    try:
        download_cifar(cfg.data)
    except Exception as err:  # offline, DNS, md5 mismatch, disk full: all mean "no real data"
        reason = f"{type(err).__name__}: {err}".splitlines()[0][:120]
        if cfg.dataset == "cifar10":
            raise UserError(f"CIFAR-10 is not in {cfg.data}/cifar-10-batches-py and could not be "
                            f"downloaded ({reason}); copy it there, or use --dataset synthetic") from None
        return _synthetic(cfg, reason=reason)
    return dataclasses.replace(cfg, dataset="cifar10")


@contextmanager
def data_lock(cfg):
    """Serialise dataset preparation between processes that share cfg.data and have no
    process group yet (torchrun workers): the first prepares, the rest find it done. Data
    already there needs no preparing, and its folder gets no lock file: a folder the user
    named is never written into (docs/DATA.md)."""
    not_a_folder(cfg.data)
    if cfg.dataset != "synthetic" and has_cifar(cfg.data):
        yield
        return
    os.makedirs(cfg.data, exist_ok=True)
    with open(os.path.join(cfg.data, ".prepare.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _synthetic(cfg, reason):
    """`reason`: why --dataset auto fell back (None when synthetic was asked for); the metrics
    record it as env.dataset_fallback (docs/METRICS.md). A fallback set goes to the cache when
    --data names the user's folder (Config.dataset_dir)."""
    cfg = dataclasses.replace(cfg, dataset="synthetic", dataset_fallback=reason or "")
    if reason is not None:
        rank0.banner(cfg,
                     f"CIFAR-10 is not in {cfg.data} and could not be downloaded ({reason}).",
                     f"Using a SYNTHETIC CIFAR-shaped dataset in {cfg.dataset_dir}.",
                     "Accuracies below are NOT CIFAR-10 results. "
                     "Pass --dataset cifar10 to require the real data.")
    if not has_layout(cfg.dataset_dir):
        rank0.say(cfg, f"generating synthetic dataset ({cfg.synthetic_train} train / "
                       f"{cfg.synthetic_test} test images) in {cfg.dataset_dir}")
        write_synthetic(cfg.dataset_dir, cfg.synthetic_train, cfg.synthetic_test)
    return cfg


def hold_out(valid_size: Optional[int], n_train: int) -> Tuple[int, str]:
    """How many of n_train images to hold out for validation, and a note when the choice was
    not the user's: --valid-size when given; else DEFAULT_VALID, or a tenth of a set too small
    for it (the course kit's command line gives none, and its loaders hold out nothing)."""
    if valid_size is not None:
        return valid_size, ""
    if n_train > DEFAULT_VALID:
        return DEFAULT_VALID, ""
    tenth = n_train // 10
    return tenth, (f"--valid-size not given and {n_train} training images are too few for its default "
                   f"{DEFAULT_VALID}: holding out a tenth ({tenth}) for validation; --valid-size N chooses "
                   "(0: none, as the course kit's loaders)")


def split_indices(n_train: int, valid_size: int, seed: int):
    """Deterministic train/valid index split, identical in every mode for a given seed."""
    if valid_size >= n_train:
        raise UserError(f"--valid-size {valid_size} leaves no training images "
                        f"(the training set has {n_train}); use less than {n_train}, or 0")
    perm = np.random.default_rng(seed).permutation(n_train)
    return np.sort(perm[valid_size:]), np.sort(perm[:valid_size])


def load_splits(cfg) -> Splits:
    """The run's splits; their notes are the run's to print once (handler/train/build.py)."""
    return read_splits(cfg.dataset_dir, cfg.valid_size, cfg.seed, say=False)


def read_splits(root: str, valid_size: Optional[int], seed: int, *, download: bool = False,
                say: bool = True) -> Splits:
    """CIFAR-10 under root, in either layout (`LAYOUTS`), as train/valid/test. The PNG tree's
    own valid/ is the validation set when it holds images; otherwise `hold_out` images are
    held out of train by `split_indices` (valid_size None: its default). download: fetch
    CIFAR-10 into root when it holds neither layout (torchvision's download=True). `say`:
    print the splits' notes (warnings about the tree, the hold-out chosen) to stderr."""
    not_a_folder(root)
    if not has_cifar(root):
        if not download:
            raise neither_layout(root)
        download_cifar(root)
    if has_layout(root):
        data: CifarArrays = read_cifar(root)
        splits = _held_out(data.train_x, data.train_y, (data.test_x, data.test_y), data.classes, valid_size, seed)
    else:
        splits = _read_tree(root, valid_size, seed)
    if say:
        for note in splits.notes:
            print(note, file=sys.stderr)
    return splits


def _read_tree(root: str, valid_size: Optional[int], seed: int) -> Splits:
    classes = tree_classes(root)
    warnings, left_out = tree_warnings(root, classes)
    notes = tuple(f"warning: {w}" for w in warnings)
    train, valid, test = (list_split(os.path.join(root, s), classes) for s in SPLITS)
    if len(train.files) < 2 or not test.files:
        raise UserError(f"{root} holds {len(train.files)} training and {len(test.files)} test images; "
                        "training needs at least 2 and testing 1")
    if valid.files:
        return Splits(train=read_split(train), valid=read_split(valid), test=read_split(test), classes=classes,
                      files=(train.files, valid.files, test.files), notes=notes, left_out=left_out,
                      valid_size=DEFAULT_VALID if valid_size is None else valid_size)
    train_x, train_y = read_split(train)
    splits = _held_out(train_x, train_y, read_split(test), classes, valid_size, seed)
    names = np.array(train.files)
    train_idx, valid_idx = split_indices(len(train_y), splits.valid_size, seed)
    return dataclasses.replace(splits, files=(list(names[train_idx]), list(names[valid_idx]), test.files),
                               notes=notes + splits.notes, left_out=left_out)


def _held_out(train_x, train_y, test: Arrays, classes, valid_size: Optional[int], seed: int) -> Splits:
    size, note = hold_out(valid_size, len(train_y))
    train_idx, valid_idx = split_indices(len(train_y), size, seed)
    return Splits(train=(train_x[train_idx], train_y[train_idx]), valid=(train_x[valid_idx], train_y[valid_idx]),
                  test=test, classes=classes, valid_size=size, notes=(f"note: {note}",) if note else ())
