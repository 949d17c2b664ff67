"""The DALI pipeline mirroring handler/data/augment.py, and its torch-facing loader.

The crop and flip are augment.crop_flip's, done in DALI operators two ways, each for a reason:
the memory source draws them in numpy (BatchFeed, so a rebuilt pipeline replays them) and cuts
them in one fused operator; the file sources draw them inside DALI (_augment_read).
tests/training/test_dali_loader.py holds the first against crop_flip image for image, the
second by its distribution (DALI's draws cannot be replayed outside it).

Imports DALI at the top: reach it through cifar10_loader, which checks DALI first.
"""
import math
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from ..data.augment import MEAN, PAD, STD
from ..runtime.nvtx import nvtx_range

SIZE = 32
READER = "Reader"


class CifarPipeline(Pipeline):
    """This rank's shard of one split as (CHW float images, labels).

    `source` is where the pixels come from:
      - "memory": the uint8 NHWC array in this process (`images`), fed batch by batch
        through external_source (a BatchFeed);
      - "raw" / "jpeg": one file per image (`images` holds the paths), read by DALI's
        file reader; "jpeg" decodes, on the GPU ("mixed") when there is one.
    `train` adds the torchvision augmentation (handler/data/augment.py crop_flip): a 32-pixel
    crop of the image padded by 4 on every side, a horizontal flip with p=0.5, then cutout
    after normalisation.
    Otherwise the pipeline only normalises, deterministically. `epoch` enters every
    seed, so one epoch's pass can be rebuilt exactly.
    """

    def __init__(self, cfg, images, labels, order, *, source: str, train: bool, epoch: int = 0,
                 drop_last: bool = False):
        gpu = cfg.use_cuda
        seed = int(np.random.SeedSequence([cfg.seed, cfg.rank, epoch]).generate_state(1)[0])
        super().__init__(batch_size=cfg.local_batch, num_threads=max(1, cfg.workers),
                         device_id=cfg.local_rank if gpu else None, seed=seed)
        # `order` lists the split's samples for this pass; each rank takes its block of it.
        self.reader_name = None if source == "memory" else READER
        with self:
            if source == "memory":
                images, label = _from_memory(cfg, images, labels, order, train=train, seed=seed,
                                             drop_last=drop_last)
            else:
                images, label = _from_files(cfg, images[order], labels[order], decode=source == "jpeg",
                                            train=train)
            if train and cfg.cutout:
                images = _cutout(images, cfg.cutout)
            self.set_outputs(images, label.gpu() if gpu else label)


def _from_memory(cfg, images, labels, order, *, train: bool, seed: int, drop_last: bool):
    lo, hi = shard_bounds(len(order), cfg.rank, cfg.world_size)
    feed = BatchFeed(images, labels, order[lo:hi], cfg.local_batch, train=train, seed=seed, drop_last=drop_last)
    padded, label, pos_x, pos_y, mirror = fn.external_source(
        feed, num_outputs=5, batch=True, batch_info=True, layout=["HWC", "", "", "", ""])
    padded = padded.gpu() if cfg.use_cuda else padded
    # One fused op crops, flips and normalises: on 32x32 images per-sample operator
    # overhead, not arithmetic, is what costs.
    return _normalise(padded, crop=(SIZE, SIZE), crop_pos_x=pos_x, crop_pos_y=pos_y, mirror=mirror), label


def _from_files(cfg, files, labels, *, decode: bool, train: bool):
    # Each rank keeps its shard: DALI's shards may differ by one image, and a
    # rank's len() must not change from pass to pass.
    data, label = fn.readers.file(
        files=[str(f) for f in files], labels=[int(y) for y in labels], name=READER,
        shard_id=cfg.rank, num_shards=cfg.world_size, stick_to_shard=True,
        random_shuffle=train, pad_last_batch=True)
    if decode:
        images = fn.decoders.image(data, device="mixed" if cfg.use_cuda else "cpu", output_type=types.DALIImageType.RGB)
    else:
        images = fn.reshape(data, shape=[SIZE, SIZE, 3], layout="HWC")
        images = images.gpu() if cfg.use_cuda else images
    return (_augment_read(images) if train else _normalise(images)), label


class BatchFeed:
    """external_source callback over one shard held in memory.

    Images come padded by PAD with zeros (RandomCrop's fill), so a crop position of
    k / (2 * PAD) for k in 0..2*PAD is an integer shift in [-PAD, PAD]. The shifts and
    flips are drawn here with numpy, from (pipeline seed, batch index): a rebuilt
    pipeline replays them exactly. Without `train` every crop is the centre, unflipped.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, order: np.ndarray, batch: int, *,
                 train: bool, seed: int, drop_last: bool = False):
        self.images, self.labels, self.order = images, np.asarray(labels, dtype=np.int32), order
        self.batch, self.train, self.seed = batch, train, seed
        self.batches = len(order) // batch if drop_last else math.ceil(len(order) / batch)

    def __call__(self, info):
        i = info.iteration
        if i >= self.batches:
            raise StopIteration
        rows = self.order[i * self.batch:(i + 1) * self.batch]
        n = len(rows)
        padded = np.zeros((n, SIZE + 2 * PAD, SIZE + 2 * PAD, 3), np.uint8)
        padded[:, PAD:PAD + SIZE, PAD:PAD + SIZE] = self.images[rows]
        if self.train:
            rng = np.random.default_rng([self.seed, i])
            pos = rng.integers(0, 2 * PAD + 1, size=(2, n)).astype(np.float32) / (2 * PAD)
            mirror = rng.integers(0, 2, size=n, dtype=np.int32)
        else:
            pos, mirror = np.full((2, n), 0.5, np.float32), np.zeros(n, np.int32)
        return padded, self.labels[rows], pos[0], pos[1], mirror


def _normalise(images, **crop_and_flip):
    return fn.crop_mirror_normalize(images, dtype=types.DALIDataType.FLOAT, output_layout="CHW",
                                    mean=[255 * m for m in MEAN], std=[255 * s for s in STD], **crop_and_flip)


def _augment_read(images):
    # An anchor in [-PAD, PAD] with zero fill is RandomCrop(32, padding=PAD) exactly.
    # start/shape as named arguments stay CPU-side; positional anchor/shape inputs of a
    # GPU slice would become GPU constants that DALI copies back and syncs on every batch.
    shift = fn.random.uniform(values=list(range(-PAD, PAD + 1)), shape=2, dtype=types.DALIDataType.INT32)
    images = fn.slice(images, start=shift, shape=[SIZE, SIZE],
                      axis_names="HW", out_of_bounds_policy="pad", fill_values=0)
    return _normalise(images, mirror=fn.random.coin_flip(probability=0.5))


def _cutout(images, size: int):
    # Same square as augment.Cutout: centred on a uniform pixel, clipped at the border.
    centre = fn.random.uniform(values=list(range(SIZE)), shape=2, dtype=types.DALIDataType.INT32)
    return fn.erase(images, anchor=fn.cast(centre - size // 2, dtype=types.DALIDataType.FLOAT),
                    shape=[float(size)] * 2, axis_names="HW", fill_value=0.0)


def shard_bounds(n: int, rank: int, world: int):
    """[lo, hi) of shard `rank` of `n` samples, cut where DALI's readers cut: floor(n*i/world)."""
    return (n * rank) // world, (n * (rank + 1)) // world


def shard_size(n: int, rank: int, world: int) -> int:
    lo, hi = shard_bounds(n, rank, world)
    return hi - lo


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
        pipe = self.make(epoch)
        # A reader knows its shard's size; a memory feed ends its pass with StopIteration.
        extent: Dict[str, Any] = {"reader_name": pipe.reader_name} if pipe.reader_name else {"size": -1}
        self.iterator = DALIGenericIterator([pipe], ["images", "labels"], auto_reset=True,
                                            last_batch_policy=self.policy, **extent)
        self.epoch, self.used = epoch, False

    def __len__(self):
        return self.batches

    def set_epoch(self, epoch: int) -> None:
        if self.reseed and (epoch != self.epoch or self.used):
            self._start(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yields len(self) batches. Before the last it ends DALI's pass: a shard one image
        shorter than its neighbours ends on an all-padding batch that no caller asks for,
        and a pass left open refuses the next pass's reset (that pass would yield nothing)."""
        self.used = True
        assert self.iterator is not None, "_start built it"
        batches = iter(self.iterator)
        for handed in range(1, self.batches + 1):
            with nvtx_range("data"):
                batch = _next_real(batches)
                if handed == self.batches:
                    _finish_pass(batches)
            if batch is None:
                return
            yield batch


Batches = Iterator[list[dict[str, torch.Tensor]]]  # a DALIGenericIterator over one pipeline


def _next_real(batches: Batches) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The next batch that holds samples, as (images, labels int64 [B]); None at the pass's end."""
    # next(), never a for loop: iter() on a DALI iterator resets it (a memory feed's pass
    # has no known size, so that reset would start the pass again).
    while (batch := next(batches, None)) is not None:
        images, labels = batch[0]["images"], batch[0]["labels"]
        if len(labels):
            return images, labels.view(-1).long()
    return None


def _finish_pass(batches: Batches) -> None:
    """Run the pass to its end, where auto_reset restarts it; only padding is left by then
    (a partial batch under the drop policy never leaves DALI)."""
    while (batch := next(batches, None)) is not None:
        if len(batch[0]["labels"]):
            raise RuntimeError("the DALI pass holds more batches than the loader's len(): "
                               "its shard size and batch disagree (handler/DALI/cifar10_loader.py)")
