"""ResNet-18 epoch time on one GPU: ddp (torchvision DataLoader) vs ddp_dali, paired by round.

    python -m bench.gpu [--quick] [--json PATH] [--workers N] [--data DIR]

Each mode trains train_cifar.py's ResNet-18 on 1 GPU through the comparison runner
(handler/compare: scripts/launch.sh, unprofiled), with bf16 autocast when the GPU runs
it natively (compute capability 8.0+) and channels_last, on a CIFAR-sized synthetic set
(50,000 train images; 2,048 with --quick). cudnn.benchmark is on (the trainer turns it on for every GPU run).

Both modes are timed by the same clock, the training loop's epoch clock: it starts before
the loader's per-epoch set-up, so DALI's pipeline rebuild and the DataLoader's worker
start-up both fall inside every timed epoch. A mode's epoch time is the median of its
epochs after the first. Every round runs both modes, the order alternating, and the
ratio ddp / ddp_dali is taken within each round (3 rounds; 2 with --quick), so drift
hits both sides of a ratio alike. Without CUDA it prints why it skips and exits 0.
"""
import tempfile
from pathlib import Path
from statistics import median
from typing import List

from bench.common import context, emit, parser, table
from handler.runtime.devices import cuda_status

FULL = dict(images=50_000, epochs=3, rounds=3)
QUICK = dict(images=2_048, epochs=2, rounds=2)
MODES = ("ddp", "ddp_dali")


def round_order(r: int) -> tuple:
    """Both modes every round; who goes first alternates."""
    return MODES if r % 2 == 0 else MODES[::-1]


def summarise(rounds: List[dict]) -> dict:
    """`rounds`: one {mode: epoch seconds, or None if it failed} per round, in order."""
    per_round = []
    for r, times in enumerate(rounds):
        both = all(times.get(mode) for mode in MODES)
        per_round.append({"round": r, "order": list(round_order(r)), "epoch_s": dict(times),
                          "ddp_over_ddp_dali": times["ddp"] / times["ddp_dali"] if both else None})
    ratios = [r["ddp_over_ddp_dali"] for r in per_round if r["ddp_over_ddp_dali"] is not None]
    samples = {mode: [t[mode] for t in rounds if t.get(mode)] for mode in MODES}
    return {"per_round": per_round, "ratio_per_round": [r["ddp_over_ddp_dali"] for r in per_round],
            "ddp_over_ddp_dali": median(ratios) if ratios else None,
            "epoch_s": {mode: median(s) for mode, s in samples.items() if s}, "samples": samples}


def report(results: dict) -> str:
    rows = [(r["round"], " then ".join(r["order"]), r["epoch_s"].get("ddp") or "failed",
             r["epoch_s"].get("ddp_dali") or "failed",
             "-" if r["ddp_over_ddp_dali"] is None else r["ddp_over_ddp_dali"]) for r in results["per_round"]]
    overall = results["ddp_over_ddp_dali"]
    return (f"ResNet-18, 1 GPU ({results['gpu']}), {' '.join(results['precision'])}, {results['images']} images\n"
            + table(["round", "order", "ddp epoch s", "ddp_dali epoch s", "ddp / ddp_dali"], rows)
            + f"\nmedian of the paired ratios: {'-' if overall is None else f'{overall:.3f}'}"
            + "".join(f"\n{mode} failed: {err}" for mode, err in results["failures"].items()))


def precision_args() -> list:
    """bf16 only where the GPU runs it natively: emulated bf16 would time the emulation."""
    from handler.runtime.precision.gpu import native_bf16
    return (["--amp", "bf16"] if native_bf16(1) else []) + ["--channels-last"]


def gpu_name() -> str:  # gpu-only: tests/machine/test_bench_gpu.py::test_the_quick_bench_times_both_modes_on_a_gpu
    import torch
    return torch.cuda.get_device_name(0)


def time_mode(mode: str, out: Path, train_args: list):  # gpu-only: tests/machine/test_bench_gpu.py::test_the_quick_bench_times_both_modes_on_a_gpu
    """(median steady epoch seconds, images/s, None) or (None, None, error) for one run."""
    from handler.compare.cells import Cell, Variant
    from handler.compare.results import build_rows
    from handler.compare.runner import run_cell
    row = build_rows([run_cell(Cell(Variant(mode, mode), 1), out, profile=False, train_args=train_args)])[0]
    return row.epoch_s, row.images_per_s, (row.error if row.epoch_s is None else None)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers / DALI threads (default 4)")
    p.add_argument("--data", help="dataset root (default: a temporary folder)")
    args = p.parse_args(argv)
    started = context("gpu")
    gpus, why = cuda_status()
    if not gpus:
        reason = f"skip: bench.gpu needs a CUDA GPU; run it on a GPU machine ({why or 'no GPU visible'})"
        return emit("gpu", {"skipped": reason}, args, reason, started)
    size = QUICK if args.quick else FULL
    extra = precision_args()
    train_args = ["--model", "resnet18", "--epochs", str(size["epochs"]), "--dataset", "synthetic",
                  "--synthetic-train", str(size["images"]), "--synthetic-test", "1000", "--valid-size", "0",
                  "--workers", str(args.workers), "--save", "none", *extra]
    rounds, rates, failures = [], {mode: [] for mode in MODES}, {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        train_args += [f"--data={args.data or Path(tmp) / 'data'}"]  # a folder named -x is a value
        for r in range(size["rounds"]):
            times: dict = {}
            for mode in round_order(r):
                epoch_s, rate, error = time_mode(mode, Path(tmp) / f"round{r}", train_args)
                times[mode] = epoch_s
                if error is not None:
                    failures.setdefault(mode, error)
                elif rate:
                    rates[mode].append(rate)
            rounds.append(times)
    results = {**size, "gpu": gpu_name(), "precision": extra, "workers": args.workers,
               **summarise(rounds), "failures": failures,
               "images_per_s": {mode: median(r) for mode, r in rates.items() if r}}
    return emit("gpu", results, args, report(results), started)


if __name__ == "__main__":
    main()
