"""The DALI pipeline mirroring handler/data/augment.py, and its torch-facing loader.

The crop and flip are augment.crop_flip's, done in DALI operators two ways, each for a reason:
the memory source draws them in numpy (BatchFeed, so a rebuilt pipeline replays them) and cuts
them in one fused operator; the file sources draw them inside DALI (_augment_read).
tests/training/test_dali_loader.py holds the first against crop_flip image for image, the
second by its distribution (DALI's draws cannot be replayed outside it).

Imports DALI at the top: reach it through cifar10_loader, which checks DALI first.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from ..data.augment import MEAN, PAD, STD

SIZE = 32
READER = "Reader"


class CifarPipeline(Pipeline):
    """The lab's Problem 6: shard `shard_id` of `num_shards` of one split as (CHW float images,
    labels), read from the class folders under `data_dir` by fn.readers.file and decoded on
    GPU `device_id` ("mixed"; on the CPU when device_id is None).

    `is_train` adds the torchvision augmentation (handler/data/augment.py crop_flip): a 32-pixel
    crop of the image padded by 4 on every side, a horizontal flip with p=0.5, then a
    `cutout_length` cutout after normalisation. Otherwise the pipeline only normalises.
    `num_workers` is DALI's thread count.

    The harness's other inputs, instead of `data_dir` (docs/DALI.md, --dali-source):
      - files, labels: this list of files; `decode` False when they hold raw uint8 pixels;
      - memory: (uint8 NHWC images, labels, order) in this process, fed batch by batch
        through external_source (a BatchFeed); `order` lists the samples of this pass.
    `seed` seeds every random draw, so one epoch's pass can be rebuilt exactly; `drop_last`
    drops a memory feed's partial last batch.
    """

    def __init__(self, data_dir, batch_size, is_train, cutout_length, device_id, shard_id, num_shards,
                 num_workers, *, seed: int = 0, files=None, labels=None, memory=None, decode: bool = True,
                 drop_last: bool = False):
        super().__init__(batch_size=batch_size, num_threads=max(1, num_workers), device_id=device_id, seed=seed)
        gpu = device_id is not None
        shard = Shard(shard_id, num_shards, batch_size, gpu)
        self.reader_name = None if memory is not None else READER
        with self:
            if memory is not None:
                images, label = _from_memory(shard, *memory, train=is_train, seed=seed, drop_last=drop_last)
            else:
                source = dict(file_root=data_dir) if files is None else \
                    dict(files=[str(f) for f in files], labels=[int(y) for y in (labels if labels is not None else ())])
                images, label = _from_files(shard, source, decode=decode, train=is_train)
            if is_train and cutout_length:
                images = _cutout(images, cutout_length)
            self.set_outputs(images, label.gpu() if gpu else label)


@dataclass(frozen=True)
class Shard:
    """Which part of the split this pipeline reads, in what batches, and where."""
    shard_id: int
    num_shards: int
    batch: int
    gpu: bool


def _from_memory(shard: Shard, images, labels, order, *, train: bool, seed: int, drop_last: bool):
    lo, hi = shard_bounds(len(order), shard.shard_id, shard.num_shards)
    feed = BatchFeed(images, labels, order[lo:hi], shard.batch, train=train, seed=seed, drop_last=drop_last)
    padded, label, pos_x, pos_y, mirror = fn.external_source(
        feed, num_outputs=5, batch=True, batch_info=True, layout=["HWC", "", "", "", ""])
    padded = padded.gpu() if shard.gpu else padded
    # One fused op crops, flips and normalises: on 32x32 images per-sample operator
    # overhead, not arithmetic, is what costs.
    return _normalise(padded, crop=(SIZE, SIZE), crop_pos_x=pos_x, crop_pos_y=pos_y, mirror=mirror), label


def _from_files(shard: Shard, source: dict, *, decode: bool, train: bool):
    # Each rank keeps its shard: DALI's shards may differ by one image, and a
    # rank's len() must not change from pass to pass.
    data, label = fn.readers.file(
        **source, name=READER, shard_id=shard.shard_id, num_shards=shard.num_shards, stick_to_shard=True,
        random_shuffle=train, pad_last_batch=True)
    if decode and shard.gpu:
        images = fn.decoders.image(data, device="mixed", output_type=types.DALIImageType.RGB)  # gpu-only: gpu_check rows `ddp_dali files (PNG tree; mixed decode)` and `2 GPUs: ddp_dali files (PNG tree; mixed decode)`
    elif decode:
        images = fn.decoders.image(data, device="cpu", output_type=types.DALIImageType.RGB)
    else:
        images = fn.reshape(data, shape=[SIZE, SIZE, 3], layout="HWC")
        images = images.gpu() if shard.gpu else images
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


class DALIWrapper:
    """The lab's wrapper of the DALI iterator: yields (images float32 NCHW, labels int64 [B])
    from the pipeline `make(epoch)` builds, has len() (batches per pass) and reset().

    `samples` is this rank's shard size; the reader pads the shard's last batch and
    the iterator trims the padding, so each sample is yielded once per pass. With
    `reseed`, every pass is an epoch of its own, as DALI's reader reshuffles every epoch:
    reset() and a new pass go on to the next one, and set_epoch(e) starts a fresh pipeline
    for exactly epoch e, so a resumed run replays the same batches. Without it (evaluation)
    one pipeline serves every pass.

    `sampler`, `dataset` and `batch_size` are what a loop written for a DataLoader reads
    (`loader.sampler.set_epoch(epoch)`, `len(loader.dataset)`); `images` is the split's size.
    """

    def __init__(self, make, samples: int, batch: int, *, drop_last: bool = False, reseed: bool = False,
                 images: int = 0):
        self.make, self.reseed = make, reseed
        self.policy = LastBatchPolicy.DROP if drop_last else LastBatchPolicy.PARTIAL
        self.batches = samples // batch if drop_last else math.ceil(samples / batch)
        self.batch_size, self.sampler, self.dataset = batch, EpochSampler(self, samples), Sized(images or samples)
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

    def reset(self) -> None:
        """End this pass: the next is the next epoch (the lab calls it after each epoch)."""
        self._start(self.epoch + 1 if self.reseed and self.used else self.epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yields len(self) batches. Before the last it ends DALI's pass: a shard one image
        shorter than its neighbours ends on an all-padding batch that no caller asks for,
        and a pass left open refuses the next pass's reset (that pass would yield nothing)."""
        if self.used and self.reseed:  # a new pass without set_epoch or reset: the next epoch
            self._start(self.epoch + 1)
        self.used = True
        assert self.iterator is not None, "_start built it"
        batches = iter(self.iterator)
        for handed in range(1, self.batches + 1):  # each inside the loop's `data` phase
            batch = _next_real(batches)
            if handed == self.batches:
                _finish_pass(batches)
            if batch is None:
                return
            yield batch


class EpochSampler:
    """`loader.sampler` of a DALIWrapper: set_epoch and len() as DistributedSampler has them
    (len: this rank's samples per pass)."""

    def __init__(self, loader: DALIWrapper, samples: int):
        self.loader, self.samples = loader, samples

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.samples


@dataclass(frozen=True)
class Sized:
    """`loader.dataset` of a DALIWrapper: the split's length, all a DataLoader loop reads of it."""
    size: int

    def __len__(self) -> int:
        return self.size


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
