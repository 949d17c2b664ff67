"""The cores model checked by the lab's CPU matrix: `compare --lab`, predicted against measured, one table.

    python -m bench.cores_matrix [--epochs 3] [--out DIR] [--quick] [--json PATH]
    python -m bench.cores_matrix --from DIR      (no run: the matrix an earlier --out DIR holds)

Runs `python -m handler.compare --lab` (dp, ddp and ddp_dali at 1 and 2 processes, profiled with
nsys) in DIR (default: a temporary folder, removed) on bench.whatif's small CPU configuration
(resnet20, a synthetic set of 3,000 images less 500 held out), --epochs epochs. Each 2-process
cell is predicted from its mode's 1-process cell by the cores model (handler/profiling/scaling/cores.py):
the run's own CPU time, the loaders' and the ranks', shared over the cores. Prints a markdown table
ready for docs/RESULTS.md: the box (CPU, cores, vector ISA, load) and date, then per cell the
measured and predicted epoch, their ratio, the loaders' and the ranks' CPU time per step, and the
median and worst error against the goal (a median of 15 % at most, no cell worse than 20 %).
The numbers mean something only on a box nothing else uses: the load before and after says so.
"""
import os
import shutil
import tempfile
from pathlib import Path
from statistics import median

from bench.common import context, emit, parser, results_cells
from bench.whatif import FULL, QUICK, run_matrix
from handler.runtime.errors import UserError, one_line_errors

GOAL_MEDIAN, GOAL_WORST = 0.15, 0.20


def isa() -> str:
    """The widest vector ISA PyTorch's CPU kernels use here, and oneDNN's cap where one is set."""
    import torch
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return torch.backends.cpu.get_cpu_capability() + (f" (ONEDNN_MAX_CPU_ISA={cap})" if cap else "")


def cpu_times(folder: Path, mode: str, count: int) -> dict:
    """The cell's machine.loader_cpu_ms and rank_cpu_ms, from its metrics JSON (the kit's layout)."""
    from handler.profiling.lab.metrics_file import read_metrics
    from handler.profiling.scaling.cores import cpu_time_of
    from handler.profiling.lab.metrics_file import read_metrics
    found = sorted(folder.glob(f"nsight_logs/{mode}_[0-9]*/gpu_{count}.metrics.json"))
    return cpu_time_of(read_metrics(found[-1], "run the matrix again (--out DIR)") if found else None)


def markdown(cells: list, times: dict, box: dict) -> tuple[str, dict]:
    """The table for docs/RESULTS.md and its summary. cells: results.json's; times: name -> cpu_time_of."""
    lines = [f"Box: {box['cpu']}, {box['cores']} cores, {box['isa']}; {box['date']}; load (1-min average) "
             f"{box['load_before']:.1f} before, {box['load_after']:.1f} after.", "",
             "| cell | measured epoch s | predicted epoch s | predicted / measured | error | loader CPU ms/step | "
             "rank CPU ms/step | from |", "|---|---|---|---|---|---|---|---|"]
    errors = []
    for c in cells:
        if c.get("status") != "ok":
            lines.append(f"| {c['name']} | {c.get('status')} | | | | | | |")
            continue
        t = times.get(c["name"]) or {}
        cpu = [f"{t[k]:.0f}" if t.get(k) is not None else "not recorded" for k in ("loader_cpu_ms", "rank_cpu_ms")]
        seen, guess = c.get("measured_epoch_s"), c.get("predicted_epoch_s")
        if not isinstance(seen, (int, float)):  # an older compare's results.json, or a cell without epochs
            lines.append(f"| {c['name']} | not recorded | | | | {cpu[0]} | {cpu[1]} | |")
            continue
        if guess is None or not seen:
            lines.append(f"| {c['name']} | {seen:.2f} | {c.get('predicted_from') or 'its own'} | | | {cpu[0]} | "
                         f"{cpu[1]} | |")
            continue
        errors.append(abs(c["prediction_error"]))
        lines.append(f"| {c['name']} | {seen:.2f} | {guess:.2f} | {guess / seen:.2f} | "
                     f"{c['prediction_error'] * 100:+.1f} % | {cpu[0]} | {cpu[1]} | {c.get('predicted_from')} |")
    found = {"median_abs_error": median(errors) if errors else None, "worst_abs_error": max(errors, default=None),
             "predicted": len(errors)}
    found["met"] = bool(errors) and found["median_abs_error"] <= GOAL_MEDIAN and found["worst_abs_error"] <= GOAL_WORST
    lines += ["", (f"Median absolute error {found['median_abs_error'] * 100:.1f} %, worst "
                   f"{found['worst_abs_error'] * 100:.1f} %, over {len(errors)} predicted cells (goal: median <= "
                   f"{GOAL_MEDIAN * 100:.0f} %, none worse than {GOAL_WORST * 100:.0f} %): "
                   f"{'met' if found['met'] else 'MISSED'}." if errors else "No cell was predicted.")]
    return "\n".join(lines), found


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--epochs", type=int, default=3, help="epochs a cell trains (default 3: the first is left out)")
    p.add_argument("--out", type=Path, help="run the matrix in this folder and keep it (default: a temporary one)")
    p.add_argument("--from", dest="source", type=Path, help="a folder an earlier --out filled: its table, no run")
    args = p.parse_args(argv)
    if args.epochs < 1:
        raise UserError(f"--epochs {args.epochs} trains nothing; give 1 or more (3: the first is left out)")
    started = context("cores_matrix")
    folder = args.source or args.out or Path(tempfile.mkdtemp(prefix="bench-cores-"))
    try:
        if args.source:
            results = folder / "compare" / "results.json"
            if not results.is_file():
                raise UserError(f"--from {folder}: no compare/results.json there; pass the folder a "
                                "`python -m bench.cores_matrix --out DIR` run filled")
            cells = results_cells(results, "--from", "run the matrix again with `python -m bench.cores_matrix "
                                  "--out DIR` and pass that DIR")
        else:
            if not shutil.which("nsys"):
                raise UserError("bench.cores_matrix predicts from nsys profiles, and nsys is not on PATH; "
                                "install it with scripts/install_nsys.sh")
            folder.mkdir(parents=True, exist_ok=True)
            train = QUICK if args.quick else [*FULL[:1], str(args.epochs), *FULL[2:]]
            cells = run_matrix(folder.resolve(), train)["cells"]
        times = {c["name"]: cpu_times(folder, str(c.get("mode")), c.get("count") or 0) for c in cells
                 if c.get("status") == "ok"}
    finally:
        if not (args.source or args.out):
            shutil.rmtree(folder, ignore_errors=True)
    box = {**started["hardware"], "isa": isa(), "date": started["date"],
           "load_before": started["load_average_before"][0], "load_after": os.getloadavg()[0]}
    text, found = markdown(cells, times, box)
    emit("cores_matrix", {**found, "box": box, "cells": cells, "cpu_time": times}, args, text, started)


if __name__ == "__main__":
    with one_line_errors("bench.cores_matrix"):
        main()
