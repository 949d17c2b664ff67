"""The DALI pipeline mirroring handler/common/augment.py, and its torch-facing loader.

Imports DALI at the top: reach it through cifar10_loader, which checks DALI first.
"""
import math

import numpy as np
from nvidia.dali import Pipeline, fn, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from ..common.augment import MEAN, PAD, STD
from ..common.nvtx import nvtx_range

SIZE = 32
READER = "Reader"


class CifarPipeline(Pipeline):
    """Reads this rank's shard of `files` and yields (CHW float images, labels).

    `train` adds the torchvision augmentation: a 32-pixel crop of the image padded
    by 4 on every side, a horizontal flip with p=0.5, then cutout after
    normalisation. Otherwise the pipeline only normalises, deterministically.
    `decode` says the files are JPEGs; without it they are raw HWC uint8 bytes.
    `epoch` enters the seed, so one epoch's pass can be rebuilt exactly.
    """

    def __init__(self, cfg, files, labels, *, train: bool, decode: bool, epoch: int = 0):
        gpu = cfg.use_cuda
        seed = np.random.SeedSequence([cfg.seed, cfg.rank, epoch]).generate_state(1)[0]
        super().__init__(batch_size=cfg.local_batch, num_threads=max(1, cfg.workers),
                         device_id=cfg.local_rank if gpu else None, seed=int(seed))
        with self:
            # Each rank keeps its shard: DALI's shards may differ by one image, and a
            # rank's len() must not change from pass to pass.
            data, label = fn.readers.file(
                files=[str(f) for f in files], labels=[int(y) for y in labels], name=READER,
                shard_id=cfg.rank, num_shards=cfg.world_size, stick_to_shard=True,
                random_shuffle=train, pad_last_batch=True)
            if decode:
                images = fn.decoders.image(data, device="mixed" if gpu else "cpu", output_type=types.RGB)
            else:
                images = fn.reshape(data, shape=[SIZE, SIZE, 3], layout="HWC")
                images = images.gpu() if gpu else images
            self.set_outputs(_transform(images, train, cfg.cutout), label.gpu() if gpu else label)


def _transform(images, train: bool, cutout: int):
    mirror = 0
    if train:
        # An anchor in [-PAD, PAD] with zero fill is RandomCrop(32, padding=PAD) exactly.
        shift = fn.random.uniform(values=list(range(-PAD, PAD + 1)), shape=2, dtype=types.INT32)
        images = fn.slice(images, shift, np.array([SIZE, SIZE], dtype=np.int32),
                          axis_names="HW", out_of_bounds_policy="pad", fill_values=0)
        mirror = fn.random.coin_flip(probability=0.5)
    images = fn.crop_mirror_normalize(images, mirror=mirror, dtype=types.FLOAT, output_layout="CHW",
                                      mean=[255 * m for m in MEAN], std=[255 * s for s in STD])
    if train and cutout:
        # Same square as augment.Cutout: centred on a uniform pixel, clipped at the border.
        centre = fn.random.uniform(values=list(range(SIZE)), shape=2, dtype=types.INT32)
        images = fn.erase(images, anchor=fn.cast(centre - cutout // 2, dtype=types.FLOAT),
                          shape=[float(cutout)] * 2, axis_names="HW", fill_value=0.0)
    return images


def shard_size(n: int, rank: int, world: int) -> int:
    """Samples in DALI's shard `rank` of `n` (its readers cut at floor(n*i/world))."""
    return (n * (rank + 1)) // world - (n * rank) // world


class DALILoader:
    """Yields (images float32 NCHW, labels int64 [B]) from the pipeline `make(epoch)` builds.

    `samples` is this rank's shard size; the reader pads the shard's last batch and
    the iterator trims the padding, so each sample is yielded once per pass. With
    `reseed`, set_epoch(e) starts a fresh pipeline for epoch e, so a resumed run
    replays the same batches; without it one pipeline serves every pass.
    """

    def __init__(self, make, samples: int, batch: int, *, drop_last: bool = False, reseed: bool = False):
        self.make, self.reseed = make, reseed
        self.policy = LastBatchPolicy.DROP if drop_last else LastBatchPolicy.PARTIAL
        self.batches = samples // batch if drop_last else math.ceil(samples / batch)
        self._start(0)

    def _start(self, epoch: int) -> None:
        self.iterator = None  # release the old pipeline before building the next
        self.iterator = DALIGenericIterator([self.make(epoch)], ["images", "labels"], reader_name=READER,
                                            auto_reset=True, last_batch_policy=self.policy)
        self.epoch, self.used = epoch, False

    def __len__(self):
        return self.batches

    def set_epoch(self, epoch: int) -> None:
        if self.reseed and (epoch != self.epoch or self.used):
            self._start(epoch)

    def __iter__(self):
        self.used = True
        batches = iter(self.iterator)
        while True:
            with nvtx_range("data"):
                batch = next(batches, None)
            if batch is None:
                return
            images, labels = batch[0]["images"], batch[0]["labels"]
            # A shard one image shorter than its neighbours can end on an all-padding batch.
            if len(labels):
                yield images, labels.view(-1).long()
