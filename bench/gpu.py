"""ResNet-18 epoch time on one GPU: ddp (torchvision DataLoader) vs ddp_dali.

    python -m bench.gpu [--quick] [--json PATH] [--workers N] [--data DIR]

Each mode trains train_cifar.py's ResNet-18 on 1 GPU through the comparison runner
(handler/compare: scripts/launch.sh, unprofiled), with bf16 autocast when the GPU
supports it and channels_last, on a CIFAR-sized synthetic set (50,000 train images;
2,048 with --quick). Epoch time is the median of the epochs after the first. The
modes alternate over rounds. Without CUDA it prints why it skips and exits 0.
"""
import tempfile
from pathlib import Path
from statistics import median

import torch

from bench.common import context, emit, parser, table
from handler.common.devices import cuda_status
from handler.compare.cells import Cell, Variant
from handler.compare.results import build_rows
from handler.compare.runner import run_cell

FULL = dict(images=50_000, epochs=3, rounds=2)
QUICK = dict(images=2_048, epochs=2, rounds=1)
MODES = ("ddp", "ddp_dali")


def precision_args() -> list:
    return (["--amp", "bf16"] if torch.cuda.is_bf16_supported() else []) + ["--channels-last"]


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
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        train_args += ["--data", args.data or str(Path(tmp) / "data")]
        times, rates, failures = {mode: [] for mode in MODES}, {mode: [] for mode in MODES}, {}
        for r in range(size["rounds"]):
            for mode in MODES[r % 2:] + MODES[:r % 2]:
                cell = Cell(Variant(mode, mode), 1)
                row = build_rows([run_cell(cell, Path(tmp) / f"round{r}", profile=False, train_args=train_args)])[0]
                if row.epoch_s is None:
                    failures[mode] = row.error
                else:
                    times[mode].append(row.epoch_s)
                    rates[mode].append(row.images_per_s)
    epoch_s = {mode: median(t) for mode, t in times.items() if t}
    results = {**size, "gpu": torch.cuda.get_device_name(0), "precision": extra, "workers": args.workers,
               "epoch_s": epoch_s, "images_per_s": {mode: median(r) for mode, r in rates.items() if r},
               "samples": times, "failures": failures,
               "ddp_over_ddp_dali": epoch_s["ddp"] / epoch_s["ddp_dali"] if len(epoch_s) == 2 else None}
    rows = [(mode, epoch_s.get(mode, "failed"), results["images_per_s"].get(mode, "")) for mode in MODES]
    text = (f"ResNet-18, 1 GPU ({results['gpu']}), {' '.join(extra)}, {size['images']} images\n"
            + table(["mode", "epoch s", "images/s"], rows)
            + "".join(f"\n{mode} failed: {err}" for mode, err in failures.items()))
    return emit("gpu", results, args, text, started)


if __name__ == "__main__":
    main()
