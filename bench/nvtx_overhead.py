"""What the NVTX ranges cost: with no profiler attached, and under nsys.

1. No profiler: the cost of one `with nvtx_range(...)` when ranges are off (the default
   without a profiler: one shared nullcontext) and when forced on (HARNESS_NVTX=1: real
   range_push/pop into libnvToolsExt with nothing listening), as ns per range and as a
   share of one measured training step (each step opens 6 ranges); and the same for one
   `with phase(...)` of the loop (handler/runtime/phases.py: the range and the CPU clock).
2. Under nsys: the same small ddp run (1 process) with and without `nsys profile`
   (scripts/nsys_options.sh), alternating, compared on the run's own epoch times
   (skipped with --quick, which only smoke-tests part 1).

    python -m bench.nvtx_overhead [--quick] [--json PATH]
"""
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Dict

from bench.common import ROOT, alternate, context, emit, fixed_batches, make_step, parser, ratio, table

RANGES_PER_STEP = 6  # batch, data, forward, backward, optimizer, + h2d on GPU or epoch share
PHASES_PER_STEP = 4  # data, forward, backward, optimizer: ranges that are timed too


def per_range_ns(active: bool, n: int, timed: bool = False) -> float:
    """ns per `with nvtx_range(FORWARD)`, or per `with phase(FORWARD)` when timed."""
    import torch

    import handler.runtime.nvtx as nvtx
    from handler.runtime.names import FORWARD
    from handler.runtime.phases import PhaseTimer
    saved = nvtx.ACTIVE
    nvtx.ACTIVE = active
    if active:
        from torch.cuda import nvtx as torch_nvtx
        nvtx._nvtx = torch_nvtx
    opener = PhaseTimer(torch.device("cpu")) if timed else nvtx.nvtx_range
    try:
        start = time.perf_counter()
        for _ in range(n):
            with opener(FORWARD):
                pass
        return (time.perf_counter() - start) / n * 1e9
    finally:
        nvtx.ACTIVE = saved


def step_seconds(steps: int, batch: int) -> float:
    from handler.train.loop import _optimise
    from models import build_model
    model = build_model("resnet20", 10)
    step = make_step(model, steps)
    batches = fixed_batches(steps + 1, batch)
    _optimise(step, *batches[0])  # warm-up
    start = time.perf_counter()
    for images, labels in batches[1:]:
        _optimise(step, images, labels)
    return (time.perf_counter() - start) / steps


def train_run(profiled: bool, args, workdir: Path) -> float:
    """Median epoch time (after the first) of one small run, from its metrics JSON."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    cmd = [sys.executable, str(ROOT / "train_cifar.py"), "--mode", "ddp", "--num_gpu", "1", "--model", "resnet20",
           "--dataset", "synthetic", "--synthetic-train", str(args.images), "--synthetic-test", "64",
           "--data", str(workdir / "data"), "--ckpt", str(out), "--save", "none", "--valid-size", "0",
           "--epochs", str(args.epochs), "--batch-size", "128", "--workers", "0", "--no-progress"]
    if profiled:
        opts = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/nsys_options.sh; printf '%s\\n' \"${{NSYS_PROFILE_OPTS[@]}}\""],
                              capture_output=True, text=True, check=True).stdout.split()
        cmd = ["nsys", "profile", *opts, "--output", str(out / "run"), *cmd]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    epochs = json.loads((out / "metrics.json").read_text())["epochs"]
    return median(e["time_s"] for e in epochs[1:])


def under_nsys(args, rounds: int, results: dict) -> str:
    """The same small run with and without nsys, alternating; adds the epoch times and
    their ratio to `results` and returns the report's line."""
    with tempfile.TemporaryDirectory() as tmp:
        times = alternate({"plain": lambda: train_run(False, args, Path(tmp)),
                           "nsys": lambda: train_run(True, args, Path(tmp))}, rounds)
    results.update({"epoch_s_plain": median(times["plain"]), "epoch_s_nsys": median(times["nsys"]),
                    "nsys_slowdown": ratio(median(times["nsys"]), median(times["plain"])), "rounds": times})
    return (f"\nunder nsys: epoch {results['epoch_s_nsys']:.2f} s vs {results['epoch_s_plain']:.2f} s "
            f"plain -> x{results['nsys_slowdown']:.3f}")


def main():
    args = parser(__doc__).parse_args()
    args.images, args.epochs, rounds = 2048, 3, 3
    started = context("nvtx_overhead")
    n = 20_000 if args.quick else 500_000
    off, on = per_range_ns(False, n), per_range_ns(True, n)
    phase_off, phase_on = per_range_ns(False, n, timed=True), per_range_ns(True, n, timed=True)
    step_s = step_seconds(3 if args.quick else 20, 128)
    results: Dict[str, Any] = {"range_ns_off": off, "range_ns_on": on, "step_s_resnet20_b128": step_s,
               "share_of_step_off": RANGES_PER_STEP * off * 1e-9 / step_s,
               "share_of_step_on": RANGES_PER_STEP * on * 1e-9 / step_s,
               "phase_ns_off": phase_off, "phase_ns_on": phase_on}
    rows = [["range off (no profiler)", off, 100 * results["share_of_step_off"]],
            ["range forced on, no profiler", on, 100 * results["share_of_step_on"]],
            ["phase (range + clock), range off", phase_off, 100 * PHASES_PER_STEP * phase_off * 1e-9 / step_s],
            ["phase (range + clock), range on", phase_on, 100 * PHASES_PER_STEP * phase_on * 1e-9 / step_s]]
    if shutil.which("nsys") and not args.quick:
        text_nsys = under_nsys(args, rounds, results)
    else:
        results["nsys_slowdown"] = None
        text_nsys = "\nunder nsys: skipped (" + ("--quick" if args.quick else "nsys not installed") + ")"
    text = table(["case", "ns per range", "% of a resnet20 step"], rows) + text_nsys
    emit("nvtx_overhead", results, args, text, started)


if __name__ == "__main__":
    main()
