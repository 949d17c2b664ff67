"""Pipeline parallelism on CPU: img/s against micro-batches M, measured vs theoretical bubble, memory.

    python -m bench.pp [--quick] [--json PATH]

resnet20 split in W = 2 stages (handler/PP, the split train_cifar.py prints) trains on
fixed synthetic batches with the pp step, each stage one process with one thread, for
M in (1, 2, 4, 8) and both schedules (1F1B needs M >= W). A stage's measured bubble is
1 - (seconds inside fwd/bwd of its micro-batches) / (seconds inside the schedule's step);
theory is (W-1)/(M+W-1). Memory per rank: parameter bytes, and the peak of tensors
autograd holds for backward (activations), counted through saved-tensor hooks (storage
shared by several saves counted once, parameters not counted). The reference row is one
process with the whole model accumulating M=4 micro-batches (the loop's --accum-steps).
"""
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import torch

from bench.common import context, emit, fixed_batches, free_port, make_step, parser, table
from handler.runtime.cpu_memory import keep_freed_memory
from handler.train.loop import _optimise
from handler.DDP.utils import destroy_process, initialize_group, run_process
from handler.profiling.bubble import theoretical_bubble
from handler.PP.schedule import Pipeline, model_to_pipeline
from handler.PP.step import pipeline_step
from models import build_model

FULL: Dict[str, Any] = dict(model="resnet20", batch=64, warmup=2, steps=6, microbatches=(1, 2, 4, 8))
QUICK: Dict[str, Any] = dict(model="resnet20", batch=8, warmup=1, steps=1, microbatches=(1, 2))


class SavedActivations:
    """Bytes of tensors autograd keeps for backward, now and at the peak."""

    def __init__(self, params):
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.refs, self.now, self.peak = {}, 0, 0

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.skip:
            return t
        if ptr not in self.refs:
            self.now += t.untyped_storage().nbytes()
            self.peak = max(self.peak, self.now)
        self.refs[ptr] = self.refs.get(ptr, 0) + 1
        return _Held(self, ptr, t)

    def release(self, ptr, nbytes):
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            del self.refs[ptr]
            self.now -= nbytes

    @staticmethod
    def unpack(held):
        return held.t if isinstance(held, _Held) else held

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Held:
    __slots__ = ("owner", "ptr", "t", "nbytes")

    def __init__(self, owner, ptr, t):
        self.owner, self.ptr, self.t, self.nbytes = owner, ptr, t, t.untyped_storage().nbytes()

    def __del__(self):
        self.owner.release(self.ptr, self.nbytes)


def worker(proc_id, world, schedule, m, port, size, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    me = initialize_group(proc_id, "127.0.0.1", port, world, use_cuda=False, timeout_s=120)
    keep_freed_memory()
    try:
        torch.manual_seed(0)
        raw = build_model(size["model"], 10)
        batches = fixed_batches(size["warmup"] + size["steps"], size["batch"])
        if schedule is None:  # the reference: one process, whole model, --accum-steps m
            model, run = raw, _optimise
        else:
            model, run = model_to_pipeline(raw, microbatches=m, schedule=schedule, batch_size=size["batch"],
                                           amp="off", verbose=False), pipeline_step
        # The optimizer holds `raw`'s parameters: after model_to_pipeline, only this stage's.
        step = dataclasses.replace(make_step(raw, len(batches)), model=model, accum_steps=m if schedule is None else 1)
        step.model.train()
        for images, labels in batches[:size["warmup"]]:
            run(step, images, labels)
        saved = SavedActivations(raw.parameters())
        busy0 = model.stage.busy_s if isinstance(model, Pipeline) else 0.0
        inside = 0.0
        torch.distributed.barrier()
        start = time.perf_counter()
        for images, labels in batches[size["warmup"]:]:
            t = time.perf_counter()
            with saved.hooks():
                run(step, images, labels)
            inside += time.perf_counter() - t
        torch.distributed.barrier()
        elapsed = time.perf_counter() - start
        busy = (model.stage.busy_s - busy0) if isinstance(model, Pipeline) else inside
        row = {"rank": me.rank, "param_bytes": sum(p.numel() * p.element_size() for p in raw.parameters()),
               "activation_peak_bytes": saved.peak, "bubble": 1 - busy / inside,
               "images_per_s": size["steps"] * size["batch"] / elapsed}
        rows = [None] * world
        torch.distributed.all_gather_object(rows, row)
        if me.rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        destroy_process()


def measure(world, schedule, m, size, folder):
    out = os.path.join(folder, f"{schedule}-{m}.json")
    run_process(worker, (world, schedule, m, free_port(), size, out), nprocs=world, use_cuda=False)
    return json.loads(Path(out).read_text())


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    started = context("pp")
    size = QUICK if args.quick else FULL
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-pp-") as folder:
        for schedule in ("gpipe", "1f1b"):
            for m in size["microbatches"]:
                if schedule == "1f1b" and m < 2:
                    continue
                runs.append({"schedule": schedule, "stages": 2, "microbatches": m,
                             "theoretical_bubble": theoretical_bubble(2, m), "ranks": measure(2, schedule, m, size, folder)})
        runs.append({"schedule": "none (1 process, --accum-steps 4)", "stages": 1, "microbatches": 4,
                     "theoretical_bubble": 0.0, "ranks": measure(1, None, 4, size, folder)})
    mib = 2 ** 20
    rows = [(r["schedule"], r["microbatches"], r["ranks"][0]["images_per_s"], r["theoretical_bubble"],
             *(x["bubble"] for x in r["ranks"]), *([None] if len(r["ranks"]) == 1 else []),
             *(x["param_bytes"] / mib for x in r["ranks"]), *([None] if len(r["ranks"]) == 1 else []),
             *(x["activation_peak_bytes"] / mib for x in r["ranks"]), *([None] if len(r["ranks"]) == 1 else []))
            for r in runs]
    text = (f"{size['model']}, global batch {size['batch']}, {size['steps']} timed steps, 2 stages x 1 thread "
            f"(gloo, {os.cpu_count()} cores)\n"
            + table(["schedule", "M", "img/s", "bubble theory", "bubble s0", "bubble s1",
                     "params MiB s0", "params MiB s1", "activ. MiB s0", "activ. MiB s1"], rows))
    return emit("pp", {**{k: v for k, v in size.items()}, "runs": runs}, args, text, started)


if __name__ == "__main__":
    main()
