"""Loader throughput: images/s over one training pass, torchvision DataLoader vs DALI.

    python -m bench.loaders [--quick] [--json PATH]

Every loader reads the same CIFAR-sized synthetic training split (50,000 images; 1,024
with --quick) with the same augmentation (pad-4 random crop + flip, no cutout) and
batch size 256, as one rank of world size 1:
  - torchvision: get_DDP_loader, the ddp mode's loader, with 0 and 2 workers;
  - DALI on CPU with 2 threads, once per data source it supports (memory, raw, jpeg);
  - DALI on the GPU, when CUDA is usable.
Each loader runs one untimed warm-up pass, then the loaders take turns, one timed
pass each per round; rates are medians over rounds. As in the training loop's epoch
time, set_epoch and iter() (DataLoader worker start, DALI pipeline build) are untimed. The headline ratio is DALI-CPU ÷
torchvision at equal parallelism (2 threads vs 2 workers), paired round by round.
"""
import dataclasses
import itertools
import tempfile
import time

import numpy as np
import torch

from bench.common import alternate, check_target, context, emit, parser, summary, table
from handler.train.config import Config
from handler.data.dataset import Splits
from handler.train.loop import sync
from handler.data.synthetic import CLASSES, make_images
from handler.DALI.cifar10_loader import get_DALI_loader
from handler.DALI.options import ARRAY_SOURCES as SOURCES  # the bench builds its arrays in memory: no PNG tree
from handler.DALI.options import DaliOptions
from handler.DDP.cifar10_loader import get_DDP_loader
from handler.data.loaders import lab_loaders

IMAGES, QUICK_IMAGES = 50_000, 1_024
BATCH = 256
ROUNDS, QUICK_ROUNDS = 5, 1
PARALLEL = 2  # workers / threads on the compared sides
TARGET = 4.0  # DALI-CPU ÷ torchvision, 2 vs 2, on a 2-core CPU
CHUNK = 5_000  # images generated at a time, to bound memory


def make_splits(n: int) -> Splits:
    rng = np.random.default_rng(0)
    parts = [make_images(min(CHUNK, n - i), rng) for i in range(0, n, CHUNK)]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    empty = (train[0][:0], train[1][:0])
    return Splits(train=train, valid=empty, test=make_images(BATCH, rng), classes=CLASSES)


def timed_pass(name: str, loader, device: torch.device, expected: int):
    """A function timing one full pass; returns images/s. Like the training loop's
    epoch timer, it starts after set_epoch and iter (worker start, pipeline build).
    A pass that yields other than `expected` images fails: its rate would mean nothing."""
    epochs = itertools.count()

    def run() -> float:
        loader.set_epoch(next(epochs))
        batches = iter(loader)
        sync(device)
        start, seen = time.perf_counter(), 0
        for _, labels in batches:
            seen += len(labels)
        sync(device)
        rate = seen / (time.perf_counter() - start)
        if seen != expected:
            raise RuntimeError(f"{name} yielded {seen} images in a pass over {expected}")
        return rate
    return run


def build_loaders(splits: Splits, data: str) -> dict:
    """{name: (train loader, device)} for every loader this machine can run."""
    base = Config(mode="ddp", batch_size=BATCH, valid_size=0, cutout=0, data=data)
    cpu = torch.device("cpu")
    loaders = {f"torchvision w{w}": (lab_loaders(get_DDP_loader, dataclasses.replace(base, workers=w), splits).train, cpu)
               for w in (0, PARALLEL)}
    dali_cfg = dataclasses.replace(base, mode="ddp_dali", workers=PARALLEL)

    def dali(cfg: Config, source: str):
        """A source's train loader; the source is the config's option, as on the command line."""
        return lab_loaders(get_DALI_loader, cfg.with_section(DaliOptions(dali_source=source)), splits, pass_cfg=True).train

    for source in SOURCES:
        loaders[f"dali-cpu {source} t{PARALLEL}"] = (dali(dali_cfg, source), cpu)
    if torch.cuda.is_available():  # gpu-only: tests/machine/test_bench_gpu.py::test_the_loaders_bench_rates_dali_on_the_gpu
        gpu_cfg = dataclasses.replace(dali_cfg, use_cuda=True, device="cuda:0")
        for source in SOURCES:
            loaders[f"dali-gpu {source} t{PARALLEL}"] = (dali(gpu_cfg, source), torch.device("cuda:0"))
    return loaders


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    started = context("loaders")
    images, rounds = (QUICK_IMAGES, QUICK_ROUNDS) if args.quick else (IMAGES, ROUNDS)
    splits = make_splits(images)
    with tempfile.TemporaryDirectory(prefix="bench-loaders-") as data:
        loaders = build_loaders(splits, data)
        runs = {name: timed_pass(name, loader, device, images) for name, (loader, device) in loaders.items()}
        for run in runs.values():
            run()  # warm-up: worker start-up, first allocations, DALI prefetch
        rates = alternate(runs, rounds)

    torchvision = rates[f"torchvision w{PARALLEL}"]
    ratios = {source: [d / t for d, t in zip(rates[f"dali-cpu {source} t{PARALLEL}"], torchvision)]
              for source in SOURCES}
    default = DaliOptions().dali_source
    headline = float(np.median(ratios[default]))
    results = {
        "images": images, "batch": BATCH, "rounds": rounds, "parallel": PARALLEL,
        "images_per_s": {name: summary(samples) for name, samples in rates.items()},
        "dali_cpu_vs_torchvision": {s: float(np.median(r)) for s, r in ratios.items()},
        "default_source": default,
        "target": check_target(headline, TARGET),
    }
    rows = [(name, s["median"], s["min"], s["max"]) for name, s in results["images_per_s"].items()]
    text = (f"{images} images, batch {BATCH}, {rounds} round(s), median images/s\n"
            + table(["loader", "images/s", "min", "max"], rows)
            + "\n" + "\n".join(f"DALI-CPU {s} ÷ torchvision ({PARALLEL} threads vs {PARALLEL} workers): {r:.2f}"
                               for s, r in results["dali_cpu_vs_torchvision"].items())
            + f"\nheadline ({default}, the default source): {headline:.2f}  target >= {TARGET}  "
              f"{'met' if results['target']['met'] else 'MISSED'}")
    return emit("loaders", results, args, text, started)


if __name__ == "__main__":
    main()
