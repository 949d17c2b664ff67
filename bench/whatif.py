"""The what-if model checked by the lab's matrix: `python -m handler.compare --lab`, small, on this machine.

    python -m bench.whatif [--quick] [--json PATH] [--keep DIR]
    python -m bench.whatif --from-results compare/results.json     (no run: an earlier matrix's errors)

Runs the kit's matrix (dp, ddp and ddp_dali at 1 and 2 processes, profiled with nsys) in a
temporary folder, as `compare --lab` does, on a small CPU configuration (resnet20, a
synthetic set of 3,000 images, 3 epochs); each cell's epoch is predicted from its mode's
1-process cell (handler/compare/predict.py, handler/profiling/whatif.py). Prints each
predicted cell's predicted and measured epoch, its error, and the median absolute error
against the goal (docs/RESULTS.md). On a CPU, dp runs as one process at any count, so
only ddp and ddp_dali at 2 processes are predicted. `--quick` trains a few images for 1
epoch: it checks that the bench runs, its numbers mean nothing. `--from-results` reads the
results.json of an earlier `compare --lab` (or of `--keep DIR`) instead of running the matrix.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, context, emit, parser, results_cells, table
from handler.runtime.errors import UserError, one_line_errors

GOAL = 0.15  # median absolute error over the predicted cells (docs/RESULTS.md)
FULL = ["--epochs", "3", "--synthetic-train", "3000", "--valid-size", "500"]
QUICK = ["--epochs", "1", "--synthetic-train", "96", "--synthetic-test", "32", "--valid-size", "0",
         "--batch-size", "32"]


def run_matrix(folder: Path, train_args: list) -> dict:
    """compare --lab in `folder` (its nsight_logs/, runs/ and data/ land there); its results.json."""
    out = folder / "compare"
    command = [sys.executable, "-m", "handler.compare", "--lab", "--profile", "1", "--out", str(out), "--", *train_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(command, cwd=folder, env=env, stderr=subprocess.PIPE, text=True)  # its lines as they come
    results = out / "results.json"
    if not results.is_file():
        raise UserError(f"compare --lab wrote no results (exit {done.returncode}): "
                        f"{(done.stderr.strip().splitlines() or ['no error output'])[-1]}")
    return json.loads(results.read_text())


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one, removed)")
    p.add_argument("--from-results", type=Path, help="a compare results.json: its errors, without running the matrix")
    args = p.parse_args(argv)
    started = context("whatif")
    if args.from_results:
        cells = results_cells(args.from_results, "--from-results",
                              "pass the results.json that python -m handler.compare --lab wrote")
    else:
        cells = run_fresh(args)["cells"]
    text, found = summarise(cells)
    emit("whatif", found, args, text, started)


def run_fresh(args) -> dict:
    if not shutil.which("nsys"):
        raise UserError("bench.whatif predicts from nsys profiles, and nsys is not on PATH; "
                        "install it with scripts/install_nsys.sh")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-whatif-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return run_matrix(folder.resolve(), QUICK if args.quick else FULL)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def summarise(cells: list) -> tuple[str, dict]:
    """The table of predicted and measured cells and the median absolute error against GOAL."""
    predicted = [c for c in cells if c.get("prediction_error") is not None]
    errors = sorted(abs(c["prediction_error"]) for c in predicted)
    median = (errors[(len(errors) - 1) // 2] + errors[len(errors) // 2]) / 2 if errors else None
    rows = [[c["name"], c.get("status"), c.get("predicted_from") or "", c.get("predicted_epoch_s"), c.get("measured_epoch_s"),
             f"{c['prediction_error'] * 100:+.1f} %" if c.get("prediction_error") is not None else "",
             c.get("predicted_bound") or ""] for c in cells]
    text = table(["cell", "status", "from", "predicted s", "measured s", "error", "bound"], rows)
    text += (f"\nmedian absolute error {median * 100:.1f} % over {len(errors)} cells (goal <= {GOAL * 100:.0f} %: "
             f"{'met' if median <= GOAL else 'MISSED'})" if median is not None else "\nno cell was predicted")
    return text, {"cells": cells, "median_abs_error": median, "goal": GOAL,
                  "met": median is not None and median <= GOAL}


if __name__ == "__main__":
    with one_line_errors("bench.whatif"):
        main()
