"""Compare parallel modes and process counts: python -m handler.compare [options] [-- train args]

    python -m handler.compare --modes dp,ddp --counts 1,2 -- --model resnet20 --epochs 2
    python -m handler.compare --cell ddp --cell "ddp:--amp bf16" --cell "nhwc=ddp:--channels-last"
    python -m handler.compare --modes ddp --hooks allreduce,bf16,powersgd --comm-bench reports/comm.json
    python -m handler.compare --lab --gpus 1,2,4      the course kit's matrix, in its file layout

Every variant (a mode from --modes, or [LABEL=]MODE[:ARGS] from --cell) runs at every
count as its own scripts/launch.sh process (--hooks runs each ddp/ddp_dali variant once
per --comm-hook); arguments after -- and --extra go to
train_cifar.py in every cell, a --cell's ARGS to its cells only. On CPU, launch.sh
puts its smoke defaults (--model resnet20 --epochs 2 --dataset synthetic) first, so
your arguments override them. The output folder gets report.md, results.json, PNG
plots and one folder per cell with its logs, metrics and nsys report.

A failed cell is a row of the report, never the end of the matrix; the exit status is
1 when a cell failed. Ctrl-C (or SIGTERM) stops the running cell and still reports
the finished ones.
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..modes import MODES, option_choices
from ..profiling.lab.page import write_cells_lab
from ..runtime.devices import cuda_status
from ..runtime.errors import OneLineParser, UserError, one_line_errors, seconds
from ..runtime.out_folder import check_out_folder
from .cells import (build_variants, check_args, default_counts, matrix, parse_counts, skip_reason, split_args,
                    sweep_hooks)
from .plots import write_plots
from .predict import add_predictions
from .provenance import provenance
from .report import pct, status, write_report
from .cells import Cell
from .results import Row, build_rows, dataset_description, recipe
from .runner import Layout, Outcome, run_cell, skipped

PROG = "python -m handler.compare"
LAB_MODES = ("dp", "ddp", "ddp_dali")  # the course kit's modes, in its order


def parse_args(argv: list[str]) -> argparse.Namespace:
    runner_argv, train_argv = _split_at_dashes(argv)
    p = OneLineParser(prog=PROG, usage=f"{PROG} [options] [-- train_cifar.py args]",
                                description=(__doc__ or "").partition("\n")[0].split(":")[0] + ".",
                                epilog="\n".join((__doc__ or "").splitlines()[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", help=f"comma-separated modes, each run with no extra options "
                                   f"(default: {','.join(MODES)} unless --cell is given)")
    p.add_argument("--cell", action="append", default=[], metavar="[LABEL=]MODE[:ARGS]",
                   help="one more variant: a mode with its own train_cifar.py options, e.g. "
                        "'ddp:--amp bf16' or 'bf16=ddp:--amp bf16'; repeatable")
    p.add_argument("--hooks", metavar="H[,H...]",
                   help=f"sweep --comm-hook ({','.join(option_choices('comm_hook'))}) over every ddp/ddp_dali variant")
    p.add_argument("--comm-bench", type=Path, metavar="JSON",
                   help="a `python -m bench.comm --json` result: adds step time against link rate per hook")
    p.add_argument("--counts", "--gpus", dest="counts",
                   help="comma-separated process/GPU counts (default: 1,2,4 capped at the "
                        "visible GPUs; 1,2 CPU processes without GPUs; --lab: 1,2)")
    p.add_argument("--lab", action="store_true",
                   help="the course kit's matrix: dp, ddp and ddp_dali at 1 and 2 GPUs (or --gpus), each run "
                        "written as the kit does, nsight_logs/<mode>_<time>/gpu_<N>.nsys-rep and "
                        "runs/<mode>_<time>/gpu_<N>/, on the kit's DATASET_DIR (dataset) when it exists; "
                        "the summary goes to --out (docs/LAB.md)")
    p.add_argument("--out", type=Path, help="output folder (default: reports/compare-<timestamp>)")
    p.add_argument("--profile", choices=("auto", "1", "0"), default="auto",
                   help="run cells under nsys: auto (when nsys is on PATH), 1 (require it) or 0")
    p.add_argument("--gpu-metrics", action="store_true",
                   help="add nsys GPU metrics sampling (SM active, DRAM, PCIe) to every profiled cell "
                        "(GPU_METRICS=1 for scripts/launch.sh)")
    p.add_argument("--extra", default="", metavar="ARGS", help="train_cifar.py options for every cell, one string")
    p.add_argument("--timeout", type=seconds, default=0, metavar="S",
                   help="stop a cell after S seconds and record it as failed (default: no limit)")
    args = p.parse_args(runner_argv)
    args.train_args = [*train_argv, *split_args(args.extra, f"--extra {args.extra!r}")]
    check_args(args.train_args, "the train arguments")
    return args


def _split_at_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def load_comm_bench(path: Path) -> dict[str, Any]:
    """bench.comm's JSON: rows of rate_mbit, hook and step_s."""
    try:
        data = json.loads(path.read_text())
        if data["rows"] and all({"rate_mbit", "hook", "step_s"} <= set(r) for r in data["rows"]):
            return data
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    raise UserError(f"--comm-bench {path} is not a bench.comm result; write one with "
                    "python -m bench.comm --json PATH")


def use_nsys(choice: str) -> bool:
    found = shutil.which("nsys") is not None
    if choice == "1" and not found:
        raise UserError("--profile 1 but nsys is not on PATH; install it with scripts/install_nsys.sh "
                        "or use --profile 0")
    return found if choice == "auto" else choice == "1"


def one_line(row: Row) -> str:
    if row.status != "ok":
        return f"{row.name}: {status(row)}: {row.error}"
    speed = f"  {row.speedup:.2f}x of {row.ideal:g}x ideal" if row.speedup is not None and row.ideal != 1 else ""
    noisy = f"  NOISY: its epochs spread {(row.epoch_spread or 0.0) * 100:.0f} %" if row.epoch_noisy else ""
    return (f"{row.name}: {row.epoch_s or 0.0:.2f} s/epoch  {row.images_per_s or 0.0:.0f} img/s  "
            f"data wait {pct(row.data_wait_share)}{speed}{noisy}")


def run_matrix(cells: list[Cell], out: Path, profile: bool, args: argparse.Namespace, gpus: int, outcomes: list[Outcome],
               layout: Layout = Layout()) -> None:
    """Run the cells in order, appending to outcomes (kept when Ctrl-C stops the matrix)."""
    bar = tqdm(cells, unit="cell", dynamic_ncols=True, file=sys.stdout, disable=None)  # no bar off a terminal
    for cell in bar:
        bar.set_postfix_str(cell.name)
        reason = skip_reason(cell, gpus)
        try:
            outcome = skipped(cell, reason) if reason else run_cell(
                cell, out, profile=profile, train_args=args.train_args, timeout_s=args.timeout,
                gpu_metrics=args.gpu_metrics, layout=layout)
        except KeyboardInterrupt:
            outcomes.append(Outcome(cell, "interrupted", error="stopped by Ctrl-C or SIGTERM"))
            raise
        outcomes.append(outcome)
        bar.write(one_line(build_rows(outcomes)[-1]))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the matrix like Ctrl-C: the cell's processes too


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.out:  # before any run
        check_out_folder(args.out, "--out")
    else:
        check_out_folder(Path("reports"), "the default --out's folder", "name a folder you can write with --out")
    for kit in ("nsight_logs", "runs") if args.lab else ():  # where --lab writes each run, as the kit does
        check_out_folder(Path(kit), "--lab's kit folder", "move it away, or run compare --lab in another folder")
    gpus = cuda_status()[0]
    if args.lab:
        args.modes, args.counts = args.modes or ",".join(LAB_MODES), args.counts or "1,2"
    variants = build_variants(args.modes, args.cell, MODES)
    if args.hooks is not None:
        variants = sweep_hooks(variants, args.hooks, option_choices("comm_hook"))
    comm_bench = load_comm_bench(args.comm_bench) if args.comm_bench else None
    counts = parse_counts(args.counts) if args.counts else default_counts(gpus)
    cells = matrix(variants, counts)
    profile = use_nsys(args.profile)
    if args.gpu_metrics and not profile:
        raise UserError("--gpu-metrics samples through nsys, but this comparison is not profiled; "
                        "drop --profile 0 (or install nsys with scripts/install_nsys.sh)")
    out = args.out or Path("reports") / time.strftime("compare-%Y%m%d-%H%M%S")
    if (out / "cells").exists():  # its cells' checkpoints and reports would be replaced
        raise UserError(f"--out {out} already holds a comparison; choose another --out (or remove that folder)")
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(cells)} cells ({len(variants)} variants x counts {','.join(map(str, counts))}), "
          f"{'profiled with nsys' if profile else 'not profiled'}, output in {out}", flush=True)
    prov = provenance(" ".join([PROG, *map(shlex.quote, argv)]))
    outcomes: list[Outcome] = []
    interrupted = False
    signal.signal(signal.SIGTERM, _interrupt)
    layout = Layout(time.strftime("%Y%m%d_%H%M%S"), os.environ.get("DATASET_DIR", "dataset")) if args.lab else Layout()
    try:
        run_matrix(cells, out.resolve(), profile, args, gpus, outcomes, layout)
    except KeyboardInterrupt:
        interrupted = True
    rows = build_rows(outcomes)
    add_predictions(rows, outcomes)
    report = write_report(out, rows, write_plots(rows, out, comm_bench), prov, recipe(outcomes),
                          dataset_description(outcomes), profile)
    if profile:  # the profiling report's lab page over the cells' reports (docs/PROFILING.md)
        lab = write_cells_lab([(o.cell.variant.label, o.cell.count, layout.report(o.cell, out / o.folder), o.metrics)
                               for o in outcomes if o.status == "ok" and o.folder], out / "lab")
        print(f"lab page: {lab}" if lab else "lab page: no profiled cell finished", flush=True)
    failed = sum(r.status == "failed" for r in rows)
    print(f"report: {report}  ({len(rows)} cells, {failed} failed{', interrupted' if interrupted else ''})")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    with one_line_errors("compare"):
        sys.exit(main())
