"""The contract every loader keeps, and the pieces torch-based loaders share.

A loader is an iterable of `(images, labels)` already on the run's device (float32
NCHW, int64 [B]), with `__len__` (batches this rank yields per pass) and
`set_epoch(e)`, called before every pass. The loop's `data` phase covers waiting for
the next batch (handler/train/loop.py); the `h2d` range inside it covers the copy to the
GPU when there is one.
"""
from typing import Iterator, NamedTuple, Optional, Protocol, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from ..runtime.errors import Stalled
from ..runtime.names import H2D
from ..runtime.nvtx import nvtx_range
from ..runtime.phases import HERE


class Loader(Protocol):
    """The contract above: DeviceLoader, DALI's and pp's loaders keep it."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]: ...

    def set_epoch(self, epoch: int) -> None: ...


class Loaders(NamedTuple):
    train: Loader
    valid: Optional[Loader]
    test: Loader


class ArrayDataset(Dataset):
    """uint8 NHWC images + labels, run through a transform (handler.data.augment) per image."""

    def __init__(self, arrays, transform):
        self.images, self.labels = arrays
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), int(self.labels[i])


class ShardSampler(Sampler):
    """Every `world`-th index from `rank`: disjoint, complete, no padding.

    Evaluation uses it so each image counts exactly once; ranks may get one batch
    more or less, which is safe because evaluation runs no collectives per batch.
    """

    def __init__(self, n: int, rank: int, world: int):
        self.indices = range(rank, n, world)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


STALL_FACTOR = 2


def stall_bound_s(dist_timeout: float) -> float:
    """How long a rank may wait for one batch before it stops, naming its loader. Twice
    --dist-timeout: a peer waiting on this rank names it (and its `data` phase) first, at
    --dist-timeout (handler/DDP/peers.py); the bound is for when none does. A DataLoader with
    workers keeps it itself (`timeout`: a worker hung in a read); with peers, the heartbeat
    keeps it too, whatever the wait is blocked in (a worker stopped half-way through sending
    a batch leaves the DataLoader reading the rest of it, where its timeout does not reach)."""
    return STALL_FACTOR * dist_timeout


def stalled_loader(waited_s: float) -> str:
    return (f"stuck in {HERE}: its data loader gave no batch for {round(waited_s, 1):g} s (the bound is {STALL_FACTOR} x "
            "--dist-timeout); a loader worker hangs (a read on a network filesystem, a deadlock) or was stopped")


class DeviceLoader:
    """Wraps a torch DataLoader to yield batches on `device`. A DataLoader given a `timeout`
    (stall_bound_s) that passes ends the run in one line naming the loader. Its `sampler`,
    `dataset` and `batch_size` are the DataLoader's, for a loop written for one
    (`loader.sampler.set_epoch(epoch)`, as the lab's may be)."""

    def __init__(self, loader: torch.utils.data.DataLoader, device: torch.device):
        self.loader, self.device = loader, device
        self.sampler, self.dataset, self.batch_size = loader.sampler, loader.dataset, loader.batch_size
        self.copies = device.type != "cpu"
        self.last_epoch: Optional[int] = None  # the sampler's epoch in the last pass
        self.epoch_set = False  # set_epoch called since that pass: replay what it names

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)  # DistributedSampler's
        if set_epoch is not None:
            set_epoch(epoch)
        self.epoch_set = True

    def next_epoch_unless_set(self) -> None:
        """A new pass that no set_epoch started is the next epoch, as DALI's reader and the
        lab's DALIWrapper go on (the lab's loop never calls set_epoch): a DistributedSampler
        alone would replay one order every epoch."""
        epoch = getattr(self.sampler, "epoch", None)
        if epoch is not None and epoch == self.last_epoch and not self.epoch_set:
            epoch += 1
            self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]  # DistributedSampler's
        self.last_epoch, self.epoch_set = epoch, False

    def __iter__(self):
        self.next_epoch_unless_set()
        batches = iter(self.loader)  # starts the workers: inside the loop's first wait for data
        for _ in range(len(self.loader)):
            try:
                images, labels = next(batches)
            except RuntimeError as err:
                if "DataLoader timed out" not in str(err):
                    raise
                raise Stalled(stalled_loader(self.loader.timeout)) from None
            if self.copies:
                with nvtx_range(H2D):  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[ddp]
                    images = images.to(self.device, non_blocking=True)
                    labels = labels.to(self.device, non_blocking=True)
            yield images, labels


def group_place(rank: Optional[int], world_size: Optional[int], device: Optional[str]) -> Tuple[int, int, str]:
    """(rank, world size, device) of this process: those given, else the process group's
    (rank 0 of 1 without one) and this rank's GPU (torch.cuda.set_device's) or the CPU."""
    import torch.distributed as tdist
    grouped = tdist.is_available() and tdist.is_initialized()
    if rank is None:
        rank = tdist.get_rank() if grouped else 0
    if world_size is None:
        world_size = tdist.get_world_size() if grouped else 1
    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return rank, world_size, device


def lab_loaders(get_loader, cfg, splits, *, pass_cfg: bool = False) -> Loaders:
    """A Strategy's make_loaders(cfg, splits) built on a loader with the lab's signature
    (get_DDP_loader, get_DALI_loader): the run's per-process batches, options and placement,
    passed as the lab's arguments and the harness's keyword extras (`pass_cfg`: the whole
    config too, for get_DALI_loader's --dali-source and derived files; otherwise the stall
    bound on one batch)."""
    # get_DALI_loader reads --dali-source from the config; a DataLoader keeps the stall bound.
    extra = {"cfg": cfg} if pass_cfg else {"stall_s": stall_bound_s(cfg.dist_timeout)}
    test, train, valid = get_loader(cfg.local_batch, cfg.local_batch, root=cfg.dataset_dir,
                                    valid_size=cfg.valid_size, valid_batch=cfg.local_batch, cutout=cfg.cutout,
                                    num_workers=cfg.workers, download=False, random_seed=cfg.seed,
                                    splits=splits, rank=cfg.rank, world_size=cfg.world_size, device=cfg.device,
                                    **extra)
    return Loaders(train, valid, test)


def seed_worker(worker_id: int) -> None:
    """numpy in workers gets a per-worker seed derived from torch's, like torch itself."""
    np.random.seed(torch.initial_seed() % 2**32)
