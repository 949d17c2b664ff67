"""Images/s of one training pass for each loader: DALI raw, DALI jpeg, torch DataLoader.

    .venv/bin/python bench/loaders_probe.py --images 10000 --batch 256 --workers 0 2

One process, world size 1, on the GPU when there is one, else the CPU. The data is
the synthetic CIFAR-shaped set. DALI's derived files are built before timing; each
loader runs one untimed warm-up pass, then the best of --repeats timed passes is
reported. Numbers go to stdout as a table.
"""
import argparse
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from handler.common.config import Config  # noqa: E402
from handler.common.dataset import Splits  # noqa: E402
from handler.common.devices import cuda_status  # noqa: E402
from handler.common.synthetic import CLASSES, make_images  # noqa: E402
from handler.DALI.cifar10_loader import SOURCES, get_DALI_loader  # noqa: E402
from handler.DDP.cifar10_loader import get_DDP_loader  # noqa: E402


def images_per_s(loader, device, repeats: int) -> float:
    """The best of `repeats` timed passes: the least disturbed by other load on the machine."""
    for _ in loader:  # warm-up: worker start-up, first allocations
        pass
    rates = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, seen = time.perf_counter(), 0
        for _, labels in loader:
            seen += len(labels)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rates.append(seen / (time.perf_counter() - start))
    return max(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=10000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                   help="DataLoader workers / DALI threads (DALI uses at least 1)")
    p.add_argument("--cutout", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="timed passes per loader; the best is shown")
    p.add_argument("--data", default=None, help="where DALI's derived files go (default: a temp dir)")
    args = p.parse_args()

    rng = np.random.default_rng(0)
    train = make_images(args.images, rng)
    empty = (train[0][:0], train[1][:0])
    splits = Splits(train=train, valid=empty, test=make_images(args.batch, rng), classes=CLASSES)
    cuda = cuda_status()[0] > 0
    device = torch.device("cuda:0" if cuda else "cpu")

    with tempfile.TemporaryDirectory() as tmp:
        base = Config(mode="ddp_dali", batch_size=args.batch, cutout=args.cutout, valid_size=0,
                      data=args.data or tmp, use_cuda=cuda, device=str(device))
        dali_threads = sorted({max(1, w) for w in args.workers})
        loaders = [(f"dali {source}", dali_threads,
                    lambda cfg, s=source: get_DALI_loader(cfg, splits, source=s)) for source in SOURCES]
        loaders.append(("torch DataLoader", args.workers, lambda cfg: get_DDP_loader(cfg, splits)))
        print(f"{args.images} images, batch {args.batch}, cutout {args.cutout}, device {device}, "
              f"{os.cpu_count()} CPU cores")
        print(f"{'loader':<18}{'workers':>8}{'images/s':>12}")
        for name, worker_counts, build in loaders:
            for workers in worker_counts:
                cfg = dataclasses.replace(base, workers=workers)
                rate = images_per_s(build(cfg).train, device, args.repeats)
                print(f"{name:<18}{workers:>8}{rate:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
