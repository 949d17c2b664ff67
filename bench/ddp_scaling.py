"""DDP scaling on CPU: training throughput of 2 ranks x 1 thread against 1 rank.

    python -m bench.ddp_scaling [--quick] [--json PATH]

Three configurations train resnet20 with the loop's real step (_optimise) on fixed
synthetic batches of one GLOBAL batch size, split over the ranks as train_cifar.py
does, in real gloo process groups (handler/DDP/utils.py, model_to_DDP):
  - 1 rank x 1 thread, 2 ranks x 1 thread each, 1 rank x 2 threads.
A fourth, the control, is 2 ranks x 1 thread with the plain model: the same work
with no gradient all-reduce, so no rank waits for the other. Its ratio to
1 rank x 2 threads is the most any DDP could reach on this machine.
Threads are set with OMP_NUM_THREADS, which initialize_group respects. Each
measurement starts fresh processes, runs untimed warm-up steps, then times the
steps between two barriers. Configurations take turns, round by round; the ratios
are paired by round and their medians reported.
"""
import json
import os
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Dict

import torch

from bench.common import (alternate, check_target, context, emit, fixed_batches, make_step,
                          parser, summary, table)
from handler.runtime.cpu_memory import keep_freed_memory
from handler.train.loop import _optimise
from handler.DDP.model import model_to_DDP
from handler.DDP.utils import destroy_process, held_store, initialize_group, run_process
from models import build_model

FULL: Dict[str, Any] = dict(model="resnet20", batch=128, warmup=3, steps=12, rounds=5)
QUICK: Dict[str, Any] = dict(model="resnet20", batch=8, warmup=1, steps=2, rounds=1)
CONTROL = "2 ranks x 1 thread, no all-reduce"
CONFIGS = {"1 rank x 1 thread": (1, 1, True), "2 ranks x 1 thread": (2, 1, True),
           "1 rank x 2 threads": (1, 2, True), CONTROL: (2, 1, False)}
TARGETS = {"2 ranks x 1 thread": {"1 rank x 1 thread": 1.8, "1 rank x 2 threads": 1.15}}
CEILING = (CONTROL, "1 rank x 2 threads")


def worker(proc_id: int, job: tuple) -> None:
    world, threads, ddp, port, size, out = job
    os.environ["OMP_NUM_THREADS"] = str(threads)
    me = initialize_group(proc_id, "127.0.0.1", port, world, use_cuda=False, timeout_s=120, store_held=True)
    keep_freed_memory()  # as fit() does in every CPU rank
    try:
        torch.manual_seed(0)
        model = build_model(size["model"], 10)
        model = model_to_DDP(model) if ddp else model
        local = size["batch"] // world
        batches = [(x[me.rank * local:(me.rank + 1) * local], y[me.rank * local:(me.rank + 1) * local])
                   for x, y in fixed_batches(size["warmup"] + size["steps"], size["batch"])]
        step = make_step(model, len(batches))
        model.train()
        for images, labels in batches[:size["warmup"]]:
            _optimise(step, images, labels)
        torch.distributed.barrier()
        start = time.perf_counter()
        for images, labels in batches[size["warmup"]:]:
            _optimise(step, images, labels)
        torch.distributed.barrier()
        elapsed = time.perf_counter() - start
        if me.rank == 0:
            Path(out).write_text(json.dumps({"images_per_s": size["steps"] * size["batch"] / elapsed,
                                             "threads": torch.get_num_threads()}))
    finally:
        destroy_process()


def measurement(world: int, threads: int, ddp: bool, size: dict, folder: str):
    def run() -> float:
        out = os.path.join(folder, f"w{world}t{threads}{'ddp' if ddp else 'plain'}.json")
        with held_store("127.0.0.1", 0) as port:
            run_process(worker, (world, threads, ddp, port, size, out), nprocs=world, use_cuda=False)
        result = json.loads(Path(out).read_text())
        assert result["threads"] == threads, f"asked for {threads} threads, the rank used {result['threads']}"
        return result["images_per_s"]
    return run


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    started = context("ddp_scaling")
    size = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as folder:
        rates = alternate({name: measurement(*config, size, folder) for name, config in CONFIGS.items()},
                          size["rounds"])
    ratios, targets = {}, {}
    for name, bases in TARGETS.items():
        for base, target in bases.items():
            key = f"{name} / {base}"
            ratios[key] = median(a / b for a, b in zip(rates[name], rates[base]))
            targets[key] = check_target(ratios[key], target)
    ceiling = median(a / b for a, b in zip(rates[CEILING[0]], rates[CEILING[1]]))
    ratios[" / ".join(CEILING)] = ceiling
    results = {**size, "cores": os.cpu_count(),
               "images_per_s": {name: summary(samples) for name, samples in rates.items()},
               "ratios": ratios, "targets": targets}
    text = (f"{size['model']}, global batch {size['batch']}, {size['steps']} timed steps, "
            f"{size['rounds']} round(s), gloo on {os.cpu_count()} cores\n"
            + table(["configuration", "images/s", "min", "max"],
                    [(n, s["median"], s["min"], s["max"]) for n, s in results["images_per_s"].items()])
            + "\n" + "\n".join(f"{k}: {t['value']:.2f}  target >= {t['target']}  {'met' if t['met'] else 'MISSED'}"
                               for k, t in targets.items())
            + f"\nceiling, {' / '.join(CEILING)}: {ceiling:.2f}")
    return emit("ddp_scaling", results, args, text, started)


if __name__ == "__main__":
    main()
