"""Proof on a GPU machine, in one command: every mode, precision and option for one short
epoch, resume, a SIGTERM stop and its resume, a profiled run, the `gpu`-marked tests, and a
2-GPU pass when two or more GPUs are visible. docs/GPU_CHECK.md.

    bash scripts/gpu_check.sh [--out DIR] [--no-tests] [--only NAMES] [--part K/N] [--budget S]
                              [--list] [--rehearse]    # PYTHON=python3 for an existing torch

Writes DIR/gpu_check.md (one table) and DIR/gpu_check.json. Exit status: 0 all passed (or
skipped, each said loudly), 1 any failure, 2 no usable CUDA GPU or a bad option, 3 a check
not started within --budget. --rehearse runs the 2-GPU plan on this CPU, GPUs hidden.
"""
import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.gpu_check_plan import (  # noqa: E402
    GPU, ONE_GPU_MODES_TEST, REHEARSAL, SIGSTOP_TEST, Check, Scale, estimate_s, parse_part, plan, select, train)
from scripts.gpu_check_rehearse import rehearse  # noqa: E402
from scripts.gpu_check_report import environment, write_reports  # noqa: E402
from scripts.gpu_check_run import Result, Runner, run_all, verify  # noqa: E402

__all__ = ["Check", "ONE_GPU_MODES_TEST", "SIGSTOP_TEST", "Result", "Runner", "environment", "main", "plan",
           "run_all", "train", "verify", "write_reports"]
REHEARSAL_GPUS = 2  # the rehearsal builds the plan of a 2-GPU machine: the 2-GPU pass is rehearsed too


def arguments(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", help="folder for the table, the JSON and the runs' logs "
                                 "(default gpu_check, or gpu_check_rehearsal with --rehearse)")
    p.add_argument("--no-tests", dest="tests", action="store_false", help="leave out the gpu-marked tests")
    p.add_argument("--only", default="", metavar="NAMES",
                   help="comma-separated check names or shell patterns ('ddp_dali*'); --list names them")
    p.add_argument("--part", default="1/1", metavar="K/N",
                   help="run part K of N (cut by the estimates), e.g. two commands --part 1/2 and --part 2/2")
    p.add_argument("--budget", type=float, default=0, metavar="S",
                   help="total seconds: a check whose estimate no longer fits is not started (its row says so, exit 3)")
    p.add_argument("--list", action="store_true", help="print the chosen checks and their estimates, run nothing")
    p.add_argument("--rehearse", action="store_true",
                   help="run the 2-GPU plan on this CPU (gloo, DALI's CPU pipelines, tiny data), GPUs hidden")
    return p.parse_args(argv)


def module_present(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # nvidia.dali: the namespace package may exist without dali
        return False


def no_dali_warning() -> str:
    from handler.runtime.cuda_build import dali_install_hint
    return f"gpu_check: WARNING: NVIDIA DALI is not installed: SKIPPING every ddp_dali check ({dali_install_hint()})"


def checks_for(gpus: int, args: argparse.Namespace, bf16: bool) -> List[Check]:
    """The plan for this machine (or, rehearsing, a 2-GPU machine's, translated for the CPU),
    then the part that --only and --part choose. ValueError for a bad choice."""
    dali, nsys = module_present("nvidia.dali"), shutil.which("nsys") is not None
    checks = plan(gpus, dali=dali, nsys=nsys, pytest_ok=module_present("pytest"), tests=args.tests, bf16=bf16)
    if args.rehearse:
        checks = rehearse(checks)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    return select(checks, only, parse_part(args.part), REHEARSAL if args.rehearse else GPU)


def say_plan(checks: List[Check], scale: Scale, budget: float) -> None:
    total = sum(estimate_s(c, scale) for c in checks)
    where = ("on this CPU (about 5 s a launch on an idle 2-core machine; CPU times say nothing about GPU times)"
             if scale is REHEARSAL
             else "on one H100 (a per-check table read from the code, never measured on a GPU)")
    print(f"gpu_check: {len(checks)} checks; ESTIMATE {total / 60:.1f} min {where}"
          + (f"; --budget {budget:g} s" if budget else ""), flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = arguments(argv)
    if args.rehearse:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: this process and every launch on the CPU
    import torch
    from handler.runtime.devices import cuda_status
    gpus, why = (REHEARSAL_GPUS, "") if args.rehearse else cuda_status()
    if not gpus:
        why = why.removesuffix("; running on CPU") or "none visible"
        print(f"gpu_check: no usable CUDA GPU ({why}); run it on a GPU machine, or --rehearse on a CPU",
              file=sys.stderr)
        return 2
    if not module_present("nvidia.dali"):
        print(no_dali_warning(), file=sys.stderr)
    try:
        checks = checks_for(gpus, args, bf16=args.rehearse or torch.cuda.is_bf16_supported())
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    scale = REHEARSAL if args.rehearse else GPU
    if args.list:
        for check in checks:
            skipped = f"  (skipped: {check.skip})" if check.skip else ""
            print(f"{estimate_s(check, scale):5.0f} s  {check.name}{skipped}")
        return 0
    return run(checks, args, scale)


def run(checks: List[Check], args: argparse.Namespace, scale: Scale) -> int:
    out = Path(args.out or ("gpu_check_rehearsal" if args.rehearse else "gpu_check")).resolve()
    env = environment(rehearsal=args.rehearse)
    say_plan(checks, scale, args.budget)
    print(f"gpu_check: {env['gpus']} x {env['gpu']}; logs under {out}/runs", flush=True)
    # The rehearsal's CPU launches wait passively, as the suite's do (tests/conftest.py): with
    # spinning OpenMP threads beside one busy core, its SIGTERM check took over 240 s, not 22 s.
    hidden = {"CUDA_VISIBLE_DEVICES": "", "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")} \
        if args.rehearse else {}
    k, n = parse_part(args.part)
    stem = "gpu_check" if n == 1 else f"gpu_check_part{k}of{n}"
    results = run_all(checks, Runner(sys.executable, out, scale, hidden), budget_s=args.budget, scale=scale,
                      after=lambda done: write_reports(done, env, out, stem))
    md, js = write_reports(results, env, out, stem)
    print(md.read_text(), end="")
    print(f"gpu_check: wrote {md} and {js}")
    if any(r.result == "fail" for r in results):
        return 1
    return 3 if any(r.result == "not run" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
