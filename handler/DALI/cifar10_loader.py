"""Loaders for --mode ddp_dali: the same split arrays as every mode, read through DALI.

Importable without DALI installed; get_DALI_loader says how to install it.
"""
import numpy as np

from ..runtime.errors import UserError
from ..data.loaders import Loaders
from .derived import derived_files
from .options import SOURCES, DaliOptions


def require_dali() -> None:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        from ..runtime.cuda_build import dali_install_hint
        raise UserError(f"--mode ddp_dali needs NVIDIA DALI: {dali_install_hint()}") from None


def resolve_source(source: str) -> str:
    """A source named in code (the command line's choices are checked by the parser)."""
    if source not in SOURCES:
        raise UserError(f"DALI source {source!r} is unknown; choose one of: {', '.join(SOURCES)}")
    return source


def get_DALI_loader(cfg, splits) -> Loaders:
    """Train: equal shards of a permutation drawn afresh each epoch (DistributedSampler's
    scheme). Valid/test: exact shards, so every image is counted once. The input is the
    config's --dali-source, the one way to choose it, so the metrics record what ran."""
    require_dali()
    from .pipeline import CifarPipeline, DALILoader, shard_size

    source = resolve_source(DaliOptions.of(cfg).dali_source)

    def inputs(images):
        """What the pipeline reads: the array itself, or one derived file per image."""
        return images if source == "memory" else np.array(derived_files(cfg, images, source))

    def train_loader(images, labels):
        pixels = inputs(images)
        samples = -(-len(labels) // cfg.world_size)
        # A one-image last batch would break BatchNorm's training statistics: drop it.
        drop_last = samples % cfg.local_batch == 1

        def make(epoch):
            order = padded_permutation(len(labels), cfg.world_size, cfg.seed, epoch)
            return CifarPipeline(cfg, pixels, labels, order, source=source, train=True, epoch=epoch,
                                 drop_last=drop_last)

        return DALILoader(make, samples, cfg.local_batch, drop_last=drop_last, reseed=True)

    def eval_loader(images, labels):
        if len(labels) == 0:
            return None
        pixels, order = inputs(images), np.arange(len(labels))
        return DALILoader(lambda epoch: CifarPipeline(cfg, pixels, labels, order, source=source, train=False),
                          shard_size(len(labels), cfg.rank, cfg.world_size), cfg.local_batch)

    train, valid, test = train_loader(*splits.train), eval_loader(*splits.valid), eval_loader(*splits.test)
    assert test is not None, "read_cifar refuses an empty test set"
    return Loaders(train, valid, test)


def padded_permutation(n: int, world: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's permutation, padded to a multiple of `world` by repeating its head as
    DistributedSampler does: equal shards, so no DDP rank waits for a missing batch."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return np.concatenate([perm, perm[:-n % world]])
