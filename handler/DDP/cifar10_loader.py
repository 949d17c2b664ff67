"""The lab's Problem 5: CIFAR-10 through torch DataLoaders, sharded with DistributedSampler
(DP and FSDP use it too, DP as one replica)."""
import sys
from typing import Any, Dict, Optional

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ..data.augment import eval_transform, train_transform
from ..data.dataset import Splits, read_splits
from ..data.loaders import ArrayDataset, DeviceLoader, ShardSampler, group_place, seed_worker


def get_DDP_loader(test_batch: int, train_batch: int, root: str = "./data", valid_size: int = 0,
                   valid_batch: int = 0, cutout: int = 16, num_workers: int = 0, download: bool = True,
                   random_seed: int = 0, shuffle: bool = True, *, splits: Optional[Splits] = None,
                   rank: Optional[int] = None, world_size: Optional[int] = None, device: Optional[str] = None,
                   stall_s: float = 0.0):
    """Problem 5: CIFAR-10 under `root` as (test_loader, train_loader, valid_loader) for this
    process's rank; batch sizes are per process.

    root: torchvision's CIFAR-10 folder or the kit's PNG tree (handler/data/dataset.py
    LAYOUTS); download fetches CIFAR-10 there when it holds neither. valid_size training
    images are held out for validation (none: valid_loader is None), the same ones for every
    random_seed. Train: each rank takes its DistributedSampler shard, reshuffled every epoch
    (set_epoch) when `shuffle`, with RandomCrop, flip and `cutout`. Valid/test: exact shards, so
    every image is counted once. Each loader yields (images, labels) on `device` and has len().

    The harness passes its own splits, rank, world_size and device; by default they come
    from root and the process group (initialize_group), on this rank's GPU when there is one.
    stall_s: how long one batch may take before the run stops naming the loader (the harness
    passes handler/data/loaders.py stall_bound_s; 0 waits forever, as torch's DataLoader does).
    """
    splits = splits or read_splits(root, valid_size, random_seed, download=download)
    rank, world_size, device = group_place(rank, world_size, device)
    place = torch.device(device)
    common: Dict[str, Any] = dict(num_workers=num_workers, pin_memory=place.type == "cuda",
                                  worker_init_fn=seed_worker)
    if num_workers and sys.platform == "linux":
        # Ranks started by mp.spawn would spawn their workers too, re-importing torch every
        # epoch (workers are not persistent, so resumed runs replay augmentation exactly).
        # Forked workers start at once; they never touch CUDA.
        common["multiprocessing_context"] = "fork"
    if num_workers and stall_s:
        common["timeout"] = stall_s  # a stuck worker ends the run, named

    train_set = ArrayDataset(splits.train, train_transform(cutout))
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=random_seed)
    # A one-image last batch would break BatchNorm's training statistics: drop it.
    train = DataLoader(train_set, batch_size=train_batch, sampler=sampler,
                       drop_last=len(sampler) % train_batch == 1, **common)

    def evaluation(arrays, batch):
        if len(arrays[1]) == 0:
            return None
        dataset = ArrayDataset(arrays, eval_transform())
        return DeviceLoader(DataLoader(dataset, batch_size=batch, sampler=ShardSampler(len(dataset), rank, world_size),
                                       **common), place)

    test = evaluation(splits.test, test_batch)
    assert test is not None, "read_splits refuses an empty test set"
    return test, DeviceLoader(train, place), evaluation(splits.valid, valid_batch or test_batch)
