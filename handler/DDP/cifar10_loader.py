"""Torch DataLoaders sharded with DistributedSampler (also used by DP with one replica)."""
import sys
from typing import Any, Dict

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ..data.augment import eval_transform, train_transform
from ..data.loaders import ArrayDataset, DeviceLoader, Loaders, ShardSampler, seed_worker, stall_bound_s


def get_DDP_loader(cfg, splits) -> Loaders:
    """Train: each rank takes its DistributedSampler shard, reshuffled every epoch
    (set_epoch). Valid/test: exact shards, so every image is counted once."""
    device = torch.device(cfg.device)
    common: Dict[str, Any] = dict(batch_size=cfg.local_batch, num_workers=cfg.workers,
                  pin_memory=device.type == "cuda", worker_init_fn=seed_worker)
    if cfg.workers and sys.platform == "linux":
        # Ranks started by mp.spawn would spawn their workers too, re-importing torch every
        # epoch (workers are not persistent, so resumed runs replay augmentation exactly).
        # Forked workers start at once; they never touch CUDA.
        common["multiprocessing_context"] = "fork"
    if cfg.workers:
        common["timeout"] = stall_bound_s(cfg.dist_timeout)  # a stuck worker ends the run, named

    train_set = ArrayDataset(splits.train, train_transform(cfg.cutout))
    sampler = DistributedSampler(train_set, num_replicas=cfg.world_size, rank=cfg.rank,
                                 shuffle=True, seed=cfg.seed)
    # A one-image last batch would break BatchNorm's training statistics: drop it.
    train = DataLoader(train_set, sampler=sampler, drop_last=len(sampler) % cfg.local_batch == 1, **common)

    def evaluation(arrays):
        if len(arrays[1]) == 0:
            return None
        dataset = ArrayDataset(arrays, eval_transform())
        return DeviceLoader(DataLoader(dataset, sampler=ShardSampler(len(dataset), cfg.rank, cfg.world_size),
                                       **common), device)

    test = evaluation(splits.test)
    assert test is not None, "read_cifar refuses an empty test set"
    return Loaders(DeviceLoader(train, device), evaluation(splits.valid), test)
