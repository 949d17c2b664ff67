"""Pipeline parallelism on CPU: both splits side by side, img/s against micro-batches M, bubble, memory.

    python -m bench.pp [--quick] [--json PATH]

resnet20 split in W = 2 stages (handler/PP) trains on fixed synthetic batches of 64 with
the pp step, each stage one process with one thread, for M in (1, 2, 4, 8), both schedules
(1F1B needs M >= W) and both splits: `params` (the model cut between its own stages where
parameters balance) and `time` (cut between blocks where the measured forward + backward
time balances; timed once per micro-batch size, cached for the bench run). The two splits
of one (schedule, M) run back to back, the first alternating, and their ratio is paired.
The reference is one process with the whole model accumulating 4 micro-batches (the
loop's --accum-steps), run at the start and at the end; `x 1 proc` divides by their mean.

The goal is then checked on the time split's fastest (schedule, M), paired: it and the
reference alternate for 3 rounds (`--quick`: 1), and the goal takes the median of the
per-round speedups and of the slow stage's bubbles (a slow stretch of the machine, or
one lucky run, then moves both sides or only one round).

A stage's measured bubble is 1 - (seconds inside fwd/bwd of its micro-batches) / (seconds
inside the schedule's step); theory is (W-1)/(M+W-1). The slow stage is the one with the
smaller bubble. Memory per rank: parameter bytes, and the peak of tensors autograd holds for
backward (activations), counted through saved-tensor hooks (storage shared by several saves
counted once, parameters not counted).
"""
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Dict

import torch

from bench.common import alternate, check_target, context, emit, fixed_batches, make_step, parser, ratio, table
from handler.runtime.cpu_memory import keep_freed_memory
from handler.train.loop import _optimise
from handler.DDP.utils import destroy_process, held_store, initialize_group, run_process
from handler.profiling.bubble import theoretical_bubble
from handler.PP.schedule import Pipeline, model_to_pipeline
from handler.PP.step import pipeline_step
from handler.PP.timing import CACHE_NAME
from models import build_model

FULL: Dict[str, Any] = dict(model="resnet20", batch=64, warmup=2, steps=10, microbatches=(1, 2, 4, 8), rounds=3)
QUICK: Dict[str, Any] = dict(model="resnet20", batch=8, warmup=1, steps=1, microbatches=(2,), rounds=1)
SPLITS = ("params", "time")
GOAL = {"speedup": 1.5, "slow_stage_bubble": 0.15}  # time split, 2 stages over 1 process (docs/RESULTS.md)


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


def worker(proc_id, job):
    world, schedule, m, split, port, size, out = job
    os.environ["OMP_NUM_THREADS"] = "1"
    me = initialize_group(proc_id, "127.0.0.1", port, world, use_cuda=False, timeout_s=120, store_held=True)
    keep_freed_memory()
    try:
        torch.manual_seed(0)
        raw = build_model(size["model"], 10)
        batches = fixed_batches(size["warmup"] + size["steps"], size["batch"])
        if schedule is None:  # the reference: one process, whole model, --accum-steps m
            model, run = raw, _optimise
        else:
            model, run = model_to_pipeline(raw, microbatches=m, schedule=schedule, batch_size=size["batch"],
                                           amp="off", split=split, model_name=size["model"],
                                           cache=str(Path(out).parent / CACHE_NAME), verbose=False), pipeline_step
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
            split_record = model.split if schedule else {}
            Path(out).write_text(json.dumps({"ranks": rows, "split": split_record}))
    finally:
        destroy_process()


def measure(world, schedule, m, split, size, folder, tag=""):
    out = os.path.join(folder, f"{schedule}-{m}-{split}{tag}.json")
    with held_store("127.0.0.1", 0) as port:
        run_process(worker, (world, schedule, m, split, port, size, out), nprocs=world, use_cuda=False)
    return json.loads(Path(out).read_text())


def _pairs(size, folder) -> list:
    """Both splits of every (schedule, M), back to back, the first alternating."""
    runs = []
    configs = [(s, m) for s in ("gpipe", "1f1b") for m in size["microbatches"] if s == "gpipe" or m >= 2]
    for k, (schedule, m) in enumerate(configs):
        for split in (SPLITS if k % 2 == 0 else SPLITS[::-1]):
            got = measure(2, schedule, m, split, size, folder)
            runs.append({"split": split, "schedule": schedule, "stages": 2, "microbatches": m,
                         "theoretical_bubble": theoretical_bubble(2, m), "ranks": got["ranks"], "cut": got["split"]})
    return sorted(runs, key=lambda r: (r["schedule"] != "gpipe", r["microbatches"], r["split"]))


def _slow_stage_bubble(ranks) -> float:
    """The bubble of the stage that idles least: the one that sets the pace."""
    return min(x["bubble"] for x in ranks)


def _summarise(runs, reference) -> dict:
    """Per run: speed over one process and the slow stage's bubble; per config: time / params;
    which time-split run is fastest (the goal's run, paired afterwards by _confirm)."""
    base = sum(r["ranks"][0]["images_per_s"] for r in reference) / len(reference)
    for r in runs:
        r["speedup_over_1_process"] = ratio(r["ranks"][0]["images_per_s"], base)
        r["slow_stage_bubble"] = _slow_stage_bubble(r["ranks"])
    by = {(r["schedule"], r["microbatches"], r["split"]): r for r in runs}
    paired = {f"{s} M={m}": ratio(by[s, m, "time"]["ranks"][0]["images_per_s"], by[s, m, "params"]["ranks"][0]["images_per_s"])
              for (s, m, split) in by if split == "time"}
    best = max((r for r in runs if r["split"] == "time"), key=lambda r: r["speedup_over_1_process"])
    return {"reference_images_per_s": [r["ranks"][0]["images_per_s"] for r in reference],
            "time_over_params": paired, "fastest_time_run": (best["schedule"], best["microbatches"])}


def _confirm(schedule: str, m: int, size, folder) -> dict:
    """The goal's run and the reference alternating, size["rounds"] rounds: per round the
    pipeline's img/s over the reference's, and the slow stage's bubble."""
    got = alternate({"reference": lambda: measure(1, None, 4, "", size, folder, "-confirm")["ranks"][0],
                     "time": lambda: measure(2, schedule, m, "time", size, folder, "-confirm")["ranks"]},
                    size["rounds"])
    return {"run": f"{schedule} M={m}",
            "speedups": [ratio(p[0]["images_per_s"], r["images_per_s"]) for r, p in zip(got["reference"], got["time"])],
            "slow_stage_bubbles": [_slow_stage_bubble(p) for p in got["time"]],
            "reference_images_per_s": [r["images_per_s"] for r in got["reference"]]}


def _goal(rounds: dict) -> dict:
    """The goal on the paired rounds' medians."""
    bubble = median(rounds["slow_stage_bubbles"])
    return {**rounds, "speedup": check_target(median(rounds["speedups"]), GOAL["speedup"]),
            "slow_stage_bubble": {"value": bubble, "target": GOAL["slow_stage_bubble"],
                                  "met": bool(bubble < GOAL["slow_stage_bubble"])}}


def _stage_text(r) -> str:
    ms = "/".join(f"{x:.0f}" for x in r["cut"].get("stage_ms", [])) or "-"
    return f"{r['cut']['cuts']} {ms}"


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    started = context("pp")
    size = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="bench-pp-") as folder:
        reference = [{"ranks": measure(1, None, 4, "", size, folder, "start")["ranks"]}]
        runs = _pairs(size, folder)
        reference.append({"ranks": measure(1, None, 4, "", size, folder, "end")["ranks"]})
        result = _summarise(runs, reference)
        schedule, m = result["fastest_time_run"]
        result["goal"] = _goal(_confirm(schedule, m, size, folder))
    mib = 2 ** 20
    rows = [(r["split"], r["schedule"], r["microbatches"], r["ranks"][0]["images_per_s"], r["speedup_over_1_process"],
             r["theoretical_bubble"], *(x["bubble"] for x in r["ranks"]), _stage_text(r),
             *(x["param_bytes"] / mib for x in r["ranks"]), *(x["activation_peak_bytes"] / mib for x in r["ranks"]))
            for r in runs]
    for k, ref in enumerate(reference):
        x = ref["ranks"][0]
        rows.append(("1 process", "--accum-steps 4", 4, x["images_per_s"], "-", 0.0, "-", "-",
                     "start" if k == 0 else "end", x["param_bytes"] / mib, "-", x["activation_peak_bytes"] / mib, "-"))
    goal = result["goal"]
    text = (f"{size['model']}, global batch {size['batch']}, {size['steps']} timed steps, 2 stages x 1 thread "
            f"(gloo, {os.cpu_count()} cores); cuts in blocks, stage ms = measured fwd+bwd per micro-batch\n"
            + table(["split", "schedule", "M", "img/s", "x 1 proc", "bubble theory", "bubble s0", "bubble s1",
                     "cut, stage ms", "params MiB s0", "params MiB s1", "activ. MiB s0", "activ. MiB s1"], rows)
            + "\ntime / params img/s: " + ", ".join(f"{k} {v:.2f}" for k, v in result["time_over_params"].items())
            + f"\ngoal (time split, fastest run {goal['run']}, median of {len(goal['speedups'])} rounds paired with "
              f"the reference: " + ", ".join(f"{x:.2f}x" for x in goal["speedups"]) + f"): {goal['speedup']['value']:.2f}x "
              f"over 1 process (target >= {GOAL['speedup']}), slow-stage bubble "
              f"{100 * goal['slow_stage_bubble']['value']:.1f} % (target < {100 * GOAL['slow_stage_bubble']:.0f} %)")
    return emit("pp", {**size, "runs": runs, "reference": reference, **result}, args, text, started)


if __name__ == "__main__":
    main()
