"""Which dataset a run uses, getting it onto disk, and the train/valid/test split."""
import dataclasses
import fcntl
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from ..runtime import rank0
from .cifar_files import CifarArrays, download_cifar, has_layout, read_cifar
from ..runtime.errors import UserError
from .synthetic import write_synthetic

Arrays = Tuple[np.ndarray, np.ndarray]  # (uint8 NHWC images, int64 labels)


@dataclass(frozen=True)
class Splits:
    train: Arrays
    valid: Arrays
    test: Arrays
    classes: List[str]


def prepare_dataset(cfg):
    """Make sure the chosen dataset is on disk; return cfg with `dataset` resolved.

    Run by rank 0 alone (or before spawning); other ranks only read afterwards.
    """
    if cfg.dataset == "synthetic":
        return _synthetic(cfg, reason=None)
    if has_layout(cfg.data):
        return dataclasses.replace(cfg, dataset="cifar10")
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
    process group yet (torchrun workers): the first prepares, the rest find it done."""
    os.makedirs(cfg.data, exist_ok=True)
    with open(os.path.join(cfg.data, ".prepare.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _synthetic(cfg, reason):
    """`reason`: why --dataset auto fell back (None when synthetic was asked for); the metrics
    record it as env.dataset_fallback (docs/METRICS.md)."""
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


def split_indices(n_train: int, valid_size: int, seed: int):
    """Deterministic train/valid index split, identical in every mode for a given seed."""
    if valid_size >= n_train:
        raise UserError(f"--valid-size {valid_size} leaves no training images "
                        f"(the training set has {n_train}); use less than {n_train}, or 0")
    perm = np.random.default_rng(seed).permutation(n_train)
    return np.sort(perm[valid_size:]), np.sort(perm[:valid_size])


def load_splits(cfg) -> Splits:
    data: CifarArrays = read_cifar(cfg.dataset_dir)
    train_idx, valid_idx = split_indices(len(data.train_y), cfg.valid_size, cfg.seed)
    return Splits(train=(data.train_x[train_idx], data.train_y[train_idx]),
                  valid=(data.train_x[valid_idx], data.train_y[valid_idx]),
                  test=(data.test_x, data.test_y),
                  classes=data.classes)
