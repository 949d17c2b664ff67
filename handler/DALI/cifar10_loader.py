"""The lab's Problems 6-7 for --mode ddp_dali: CifarPipeline and DALIWrapper (pipeline.py),
and get_DALI_loader here: the same splits as every mode, read through DALI.

Importable without DALI installed; get_DALI_loader says how to install it.
"""
from typing import Any, Dict, Optional

import numpy as np
import torch

from ..runtime.errors import UserError
from ..data.dataset import Splits, read_splits
from ..data.loaders import group_place
from .derived import derived_files
from .options import SOURCES, DaliOptions


def require_dali() -> None:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        from ..runtime.cuda_build import dali_install_hint
        raise UserError(f"--mode ddp_dali needs NVIDIA DALI: {dali_install_hint()}") from None


def __getattr__(name: str):
    """The lab's CifarPipeline and DALIWrapper are this module's names too, as in the kit; they
    live in pipeline.py, which imports DALI, so they load (and check DALI) on first use."""
    if name in ("CifarPipeline", "DALIWrapper"):
        require_dali()
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_source(source: str) -> str:
    """A source named in code (the command line's choices are checked by the parser)."""
    if source not in SOURCES:
        raise UserError(f"DALI source {source!r} is unknown; choose one of: {', '.join(SOURCES)}")
    return source


def get_DALI_loader(test_batch: int, train_batch: int, root: str = "./data", valid_size: int = 0,
                    valid_batch: int = 0, cutout: int = 16, num_workers: int = 4, download: bool = True,
                    random_seed: int = 0, shuffle: bool = True, *, splits: Optional[Splits] = None,
                    rank: Optional[int] = None, world_size: Optional[int] = None, device: Optional[str] = None,
                    cfg=None):
    """Problem 7: get_DDP_loader's loaders, read through DALI pipelines (CifarPipeline): the
    kit's PNG tree under `root` is read as files by fn.readers.file, torchvision's folder from
    memory. Returns (test_loader, train_loader, valid_loader), each a DALIWrapper.

    Train: equal shards of a permutation drawn afresh each epoch (DistributedSampler's
    scheme; `shuffle` False keeps the files' order); reset() or a new pass goes on to the next
    epoch, set_epoch(e) (or `.sampler.set_epoch(e)`) starts epoch e. Valid/test: exact shards, so every image
    is counted once. The harness passes its splits, placement and config (`cfg`), whose
    --dali-source picks the input, the one way to choose it, so the metrics record what ran.
    """
    require_dali()
    from .pipeline import CifarPipeline, DALIWrapper, shard_size

    splits = splits or read_splits(root, valid_size, random_seed, download=download)
    rank, world, device = group_place(rank, world_size, device)
    device_id = torch.device(device).index if torch.device(device).type == "cuda" else None
    source = resolve_source(DaliOptions.of(cfg).dali_source if cfg else ("files" if splits.files else "memory"))
    if source == "files" and not splits.files:
        raise UserError(f"--dali-source files reads the PNG tree (DIR/train/<class>/<n>.png); {root} is "
                        "torchvision's folder: use --dali-source memory, raw or jpeg, or point --data at the tree")

    def inputs(split: int, images, labels) -> dict:
        """What the pipeline reads: the array itself, or one file per image."""
        if source == "memory":
            return {"images": images}
        if source == "files":
            assert splits.files is not None, "checked above"
            return {"files": np.array(splits.files[split]), "decode": True}
        assert cfg is not None, "raw and jpeg are the harness's, derived from its arrays"
        return {"files": np.array(derived_files(cfg, images, source)), "decode": source == "jpeg"}

    def pipeline(read: dict, labels, order, batch: int, *, train: bool, seed: int, drop_last: bool = False):
        given: Dict[str, Any] = {"memory": (read["images"], labels, order)} if "images" in read else \
            {"files": read["files"][order], "labels": labels[order], "decode": read["decode"]}
        return CifarPipeline(None, batch, train, cutout if train else 0, device_id, rank, world, num_workers,
                             seed=seed, drop_last=drop_last, **given)

    def train_loader(images, labels):
        read = inputs(0, images, labels)
        samples = -(-len(labels) // world)
        # A one-image last batch would break BatchNorm's training statistics: drop it.
        drop_last = samples % train_batch == 1

        def make(epoch):
            order = padded_permutation(len(labels), world, random_seed, epoch, shuffled=shuffle)
            seed = int(np.random.SeedSequence([random_seed, rank, epoch]).generate_state(1)[0])
            return pipeline(read, labels, order, train_batch, train=True, seed=seed, drop_last=drop_last)

        return DALIWrapper(make, samples, train_batch, drop_last=drop_last, reseed=True, images=len(labels))

    def eval_loader(split: int, images, labels, batch: int):
        if len(labels) == 0:
            return None
        read, order = inputs(split, images, labels), np.arange(len(labels))
        seed = int(np.random.SeedSequence([random_seed, rank, 0]).generate_state(1)[0])
        return DALIWrapper(lambda epoch: pipeline(read, labels, order, batch, train=False, seed=seed),
                           shard_size(len(labels), rank, world), batch, images=len(labels))

    train = train_loader(*splits.train)
    valid, test = eval_loader(1, *splits.valid, valid_batch or test_batch), eval_loader(2, *splits.test, test_batch)
    assert test is not None, "read_splits refuses an empty test set"
    return test, train, valid


def padded_permutation(n: int, world: int, seed: int, epoch: int, *, shuffled: bool = True) -> np.ndarray:
    """The epoch's permutation (the identity unless `shuffled`), padded to a multiple of `world`
    by repeating its head as DistributedSampler does: equal shards, so no DDP rank waits for a
    missing batch."""
    perm = np.random.default_rng([seed, epoch]).permutation(n) if shuffled else np.arange(n)
    return np.concatenate([perm, perm[:-n % world]])
