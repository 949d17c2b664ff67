"""Harness overhead: the real training loop's images/s ÷ a bare minimal loop's.

    python -m bench.overhead [--quick] [--json PATH]

Both sides train the same model (resnet20; same initial weights) on the same batches,
made once and already on the device, with the same optimizer (the trainer's SGD):
  - harness: handler/train/loop.py's train_epoch with the real Step (scheduler,
    disabled GradScaler, no-op autocast, on-device loss/accuracy sums) and the
    trainer's per-step StopFlag check, the model
    DDP-wrapped in a 1-rank gloo group as --mode ddp does, NVTX ranges enabled
    (HARNESS_NVTX=1; no profiler attached, so they are cheap pushes and pops);
  - loop, unwrapped: the same train_epoch without DDP, to split the overhead between
    the wrapper and the loop;
  - bare: zero_grad, forward, cross-entropy, backward, step.
One untimed block each first; then the sides take turns, one block of steps each per
round. The ratio is harness ÷ bare, paired round by round, median over rounds.

Each harness block pays a fixed cost besides its steps (two device syncs, the loss/accuracy
all-reduce and the divergence check, each read on the host). On a GPU step of a few ms a
5-step block would count that cost as overhead, so a block runs at least `block_s` seconds:
the warm-up times a bare step, and the premade batches are cycled to enough steps.
"""
import os

os.environ.setdefault("HARNESS_NVTX", "1")  # before handler.runtime.nvtx is imported

import copy  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from statistics import median  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import (alternate, check_target, context, emit, fixed_batches,  # noqa: E402
                          make_optimizer, make_step, parser, summary, table)
from handler.runtime import nvtx  # noqa: E402
from handler.train.divergence import DivergenceGuard  # noqa: E402
from handler.train.loop import sync, train_epoch  # noqa: E402
from handler.runtime.stopping import StopFlag  # noqa: E402
from handler.DDP.model import model_to_DDP  # noqa: E402
from handler.DDP.utils import destroy_process, held_store, initialize_group  # noqa: E402
from models import build_model  # noqa: E402

FULL = dict(model="resnet20", batch=128, steps=5, rounds=15, block_s=0.5)
QUICK = dict(model="resnet20", batch=8, steps=2, rounds=2, block_s=0.05)
MAX_STEPS = 2_000  # per block: a bound on the calibration, whatever it measured
TARGET = 0.97


class PremadeLoader:
    """The loader contract (len, iter, set_epoch) over batches already on the device."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)

    def set_epoch(self, epoch: int) -> None:
        pass


class NoBar:
    def update(self, n: int) -> None:
        pass


def harness_block(model, batches, device, stop):
    step = make_step(model, len(batches))
    loader = PremadeLoader(batches)

    def run() -> float:
        start = time.perf_counter()
        result = train_epoch(step, loader, 0, device, NoBar(), stop=stop, guard=DivergenceGuard(device, 1))
        if result["stopped_at"] is not None:  # the StopFlag took our Ctrl-C
            raise KeyboardInterrupt
        return result["samples"] / (time.perf_counter() - start)
    return run


def bare_block(model, batches, device):
    optimizer = make_optimizer(model)

    def run() -> float:
        model.train()
        sync(device)
        start = time.perf_counter()
        for images, labels in batches:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
        sync(device)
        return sum(len(y) for _, y in batches) / (time.perf_counter() - start)
    return run


def counting_faults(run, faults: list):
    """run, also appending the minor page faults it caused: the CPU allocator's cost
    shows up as pages freshly mapped and zeroed (see docs/RESULTS.md)."""
    def counted() -> float:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rate = run()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return rate
    return counted


def block_steps(step_s: float, minimum: int, block_s: float) -> int:
    """Steps per timed block: at least `minimum`, and enough that a block lasts `block_s`
    seconds at `step_s` a step, so its fixed cost (syncs, host reads) is a small share."""
    if step_s <= 0:
        return MAX_STEPS
    return max(minimum, min(MAX_STEPS, math.ceil(block_s / step_s)))


def cycled(batches: list, steps: int) -> list:
    """`steps` batches, the premade ones over again: no new device memory."""
    return [batches[i % len(batches)] for i in range(steps)]


def measure(size: dict, device: torch.device, faults: dict) -> dict:
    """{name: [images/s of each round]}, and size["steps_per_block"] set to the block length used."""
    torch.manual_seed(0)
    raw = build_model(size["model"], 10).to(device)
    batches = fixed_batches(size["steps"], size["batch"], device)
    bare = bare_block(copy.deepcopy(raw), batches, device)
    bare()  # warm-up, then one timed bare block sets the block length
    steps = block_steps(size["batch"] / bare(), size["steps"], size["block_s"])
    size["steps_per_block"] = steps
    batches[:] = cycled(batches, steps)  # every side's block now runs `steps` steps
    stop = StopFlag()  # the trainer's per-step stop check (an async all-reduce in a group)
    try:
        runs = {"harness (ddp, world 1)": harness_block(model_to_DDP(copy.deepcopy(raw)), batches, device, stop),
                "loop, unwrapped": harness_block(copy.deepcopy(raw), batches, device, stop),
                "bare": bare}
        for run in runs.values():
            run()  # warm-up: allocator, DDP buckets, first-touch of weights
        return alternate({name: counting_faults(run, faults.setdefault(name, [])) for name, run in runs.items()},
                         size["rounds"])
    finally:
        stop.close()


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    started = context("overhead")
    size = dict(QUICK if args.quick else FULL)
    cuda = torch.cuda.is_available()
    with held_store("127.0.0.1", 0) as port:
        me = initialize_group(0, "127.0.0.1", port, 1, use_cuda=cuda, timeout_s=60, store_held=True)
        try:
            faults = {}
            rates = measure(size, torch.device(me.device), faults)
        finally:
            destroy_process()
    paired = {name: [a / b for a, b in zip(samples, rates["bare"])] for name, samples in rates.items()}
    headline = median(paired["harness (ddp, world 1)"])
    results = {**size, "device": me.device, "threads": torch.get_num_threads(), "nvtx_active": nvtx.ACTIVE,
               "images_per_s": {name: summary(samples) for name, samples in rates.items()},
               "ratio_to_bare": {name: median(r) for name, r in paired.items()},
               "page_faults_per_step": {name: median(f) / size["steps_per_block"] for name, f in faults.items()},
               "target": check_target(headline, TARGET)}
    rows = [(name, s["median"], s["min"], s["max"], results["ratio_to_bare"][name],
             int(results["page_faults_per_step"][name])) for name, s in results["images_per_s"].items()]
    text = (f"{size['model']}, batch {size['batch']}, {size['steps_per_block']} steps/block "
            f"(at least {size['block_s']} s), {size['rounds']} rounds, "
            f"{me.device}, {results['threads']} threads, NVTX {'on' if nvtx.ACTIVE else 'off'}\n"
            + table(["loop", "images/s", "min", "max", "÷ bare", "page faults/step"], rows)
            + f"\nharness ÷ bare: {headline:.3f}  target >= {TARGET}  "
              f"{'met' if results['target']['met'] else 'MISSED'}")
    return emit("overhead", results, args, text, started)


if __name__ == "__main__":
    main()
