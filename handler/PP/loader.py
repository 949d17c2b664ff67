"""pp loaders: every stage walks the same global batches in the same order, and gets only
what it uses: the first stage the images, the last the labels (the others empty
tensors). The loop counts labels, so each image is counted once, on the last stage.

Training batches have fixed micro-batch shapes, so an incomplete last batch is dropped
(and said so).
"""
import sys
from typing import Any, Dict

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from ..runtime import rank0
from ..data.augment import eval_transform, train_transform
from ..data.loaders import ArrayDataset, DeviceLoader, Loaders, ShardSampler, seed_worker


class _Labels(Dataset):
    """Stages after the first decode no images."""

    def __init__(self, labels):
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return 0, int(self.labels[i])


class StageLoader:
    """The loader contract (handler/data/loaders.py: `(images, labels)` on the device, `__len__`, `set_epoch`)."""

    def __init__(self, inner: DeviceLoader, first: bool, last: bool, device):
        self.inner, self.first, self.last = inner, first, last
        self.no_images = torch.empty(0, 3, 32, 32, device=device)
        self.no_labels = torch.empty(0, dtype=torch.int64, device=device)

    def __len__(self):
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self):
        for images, labels in self.inner:
            yield images if self.first else self.no_images, labels if self.last else self.no_labels


def get_PP_loader(cfg, splits) -> Loaders:
    device = torch.device(cfg.device)
    first, last = cfg.rank == 0, cfg.rank == cfg.world_size - 1
    workers = cfg.workers if first else 0
    common: Dict[str, Any] = dict(batch_size=cfg.batch_size, num_workers=workers, pin_memory=device.type == "cuda",
                  worker_init_fn=seed_worker)
    if workers and sys.platform == "linux":
        common["multiprocessing_context"] = "fork"  # as in handler/DDP/cifar10_loader.py

    def dataset(arrays, transform):
        return ArrayDataset(arrays, transform) if first else _Labels(arrays[1])

    train_set = dataset(splits.train, train_transform(cfg.cutout))
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)
    dropped = len(train_set) % cfg.batch_size
    if dropped:
        rank0.say(cfg, f"pp: the last {dropped} training images of each epoch make no full batch of "
                       f"{cfg.batch_size} (micro-batches have fixed shapes); they are skipped", err=True)
    train = DataLoader(train_set, sampler=sampler, drop_last=True, **common)

    def evaluation(arrays):
        if len(arrays[1]) == 0:
            return None
        data = dataset(arrays, eval_transform())
        return StageLoader(DeviceLoader(DataLoader(data, sampler=ShardSampler(len(data), 0, 1), **common), device),
                           first, last, device)

    test = evaluation(splits.test)
    assert test is not None, "read_cifar refuses an empty test set"
    return Loaders(StageLoader(DeviceLoader(train, device), first, last, device),
                   evaluation(splits.valid), test)
