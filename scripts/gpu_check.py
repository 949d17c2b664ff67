"""Proof on a GPU machine, in one command: every mode, precision and option for one short
epoch, resume, a SIGTERM stop and its resume, a profiled run, the `gpu`-marked tests, and a
2-GPU pass when two or more GPUs are visible. docs/GPU_CHECK.md.

    bash scripts/gpu_check.sh [--out DIR] [--no-tests] [--only NAMES] [--part K/N] [--budget S]
                              [--list] [--rehearse] [--offline]   # PYTHON=python3 for an existing torch

Writes DIR/gpu_check.md (one table) and DIR/gpu_check.json. Exit status: 0 all passed (or
skipped, each said loudly), 1 any failure, 2 no usable CUDA GPU or a bad option, 3 a check
not started within --budget, 143 stopped by SIGTERM (the current check's processes ended,
the report written). --rehearse runs the 2-GPU plan on this CPU, GPUs hidden.
"""
import argparse
import fnmatch
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.gpu_check_machine import (  # noqa: E402
    measured_times, missing_pieces, module_present, no_dali_warning, nsys_problem, out_problem, skip_lines)
from scripts.gpu_check_plan import (  # noqa: E402
    GPU, ONE_GPU_MODES_TEST, REHEARSAL, SIGSTOP_TEST, Check, Scale, estimate_s, parse_part, plan, select, train)
from scripts.gpu_check_rehearse import rehearse  # noqa: E402
from scripts.gpu_check_report import environment, write_reports  # noqa: E402
from scripts.gpu_check_run import Result, Runner, run_all, verify  # noqa: E402

__all__ = ["Check", "ONE_GPU_MODES_TEST", "SIGSTOP_TEST", "Result", "Runner", "environment", "main", "module_present",
           "no_dali_warning", "plan", "run_all", "train", "verify", "write_reports"]
REHEARSAL_GPUS = 2  # the rehearsal builds the plan of a 2-GPU machine: the 2-GPU pass is rehearsed too
OFFLINE_BUDGET_S = 570  # --offline on a GPU: one 10-minute command, with room to write the report
PROFILED = "profiled run (nsys)"


class Terminated(BaseException):
    """SIGTERM (`timeout`, Slurm's time limit): raised where gpu_check waits on a check, so the
    Runner's `finally` ends that check's process group before the report is written."""


class OneLineParser(argparse.ArgumentParser):
    """An unknown option or a missing value: one line, not argparse's usage block; a prefix of an
    option is named, never taken for it (allow_abbrev=False)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"gpu_check: {message}; bash scripts/gpu_check.sh --help lists the options\n")


def every_check_name() -> List[str]:
    """Every name --only can match on some machine (the 2-GPU plan with and without native bf16)."""
    return [c.name for bf16 in (True, False) for c in plan(2, dali=True, nsys=True, pytest_ok=True, bf16=bf16)]


def only_problems(only: Optional[str]) -> List[str]:
    """--only given with no name in it (it would select every check) or with a name no check has."""
    if only is None:
        return []
    names = [name.strip() for name in only.split(",") if name.strip()]
    if not names:
        return [f"gpu_check: --only {only!r} names no check; name one or more (--list names them), or leave --only "
                "out to run every check"]
    known = every_check_name()
    unknown = [name for name in names if not any(fnmatch.fnmatchcase(check, name) for check in known)]
    return [f"gpu_check: --only {', '.join(unknown)}: no such check; `--list` names them"] if unknown else []


def arguments(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = OneLineParser(prog="scripts/gpu_check.sh", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", help="folder for the table, the JSON and the runs' logs "
                                 "(default gpu_check, or gpu_check_rehearsal with --rehearse)")
    p.add_argument("--no-tests", dest="tests", action="store_false", help="leave out the gpu-marked tests")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated check names or shell patterns ('ddp_dali*'); --list names them")
    p.add_argument("--part", default="1/1", metavar="K/N",
                   help="run part K of N (cut by the estimates), e.g. two commands --part 1/2 and --part 2/2")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="total seconds: a check whose estimate no longer fits is not started (its row says so, exit 3)")
    p.add_argument("--list", action="store_true", help="print the chosen checks and their estimates, run nothing")
    p.add_argument("--rehearse", action="store_true",
                   help="run the 2-GPU plan on this CPU (gloo, DALI's CPU pipelines, tiny data), GPUs hidden")
    p.add_argument("--offline", action="store_true",
                   help=f"no package index: install nothing (gpu_check.sh picks a Python with torch); on a GPU "
                        f"--budget defaults to {OFFLINE_BUDGET_S} s, one 10-minute command")
    args = p.parse_args(argv)
    # One line per bad option, said before anything runs.
    args.problems = [] if args.budget is None or (math.isfinite(args.budget) and args.budget > 0) else [
        f"gpu_check: --budget {args.budget:g} is not a finite number of seconds above 0; give e.g. --budget 570, "
        "or leave it out for no budget"]
    if args.budget is None:
        args.budget = OFFLINE_BUDGET_S if args.offline and not args.rehearse else 0.0
    args.out = Path(args.out or ("gpu_check_rehearsal" if args.rehearse else "gpu_check")).resolve()
    args.problems += [line for line in (out_problem(args.out),) if line] + only_problems(args.only)
    try:
        parse_part(args.part)
    except ValueError as err:
        args.problems.append(f"gpu_check: {err}")
    return args


def check_options(argv: Sequence[str]) -> int:
    """The options alone, for scripts/gpu_check.sh before any set-up, venv or download: 0, or 2
    after one line per problem."""
    problems = arguments(argv).problems
    print("\n".join(problems), file=sys.stderr) if problems else None
    return 2 if problems else 0


def checks_for(gpus: int, args: argparse.Namespace, bf16: bool, measured: dict) -> List[Check]:
    """The plan for this machine (or, rehearsing, a 2-GPU machine's, translated for the CPU),
    then the part that --only and --part choose. ValueError for a bad choice."""
    checks = plan(gpus, dali=module_present("nvidia.dali"), nsys=shutil.which("nsys") is not None,
                  pytest_ok=module_present("pytest"), tests=args.tests, bf16=bf16)
    if args.rehearse:
        checks = rehearse(checks)
    only = [name.strip() for name in (args.only or "").split(",") if name.strip()]
    chosen = select(checks, only, parse_part(args.part), REHEARSAL if args.rehearse else GPU, measured)
    # An nsys on PATH may still make no report: probed (about 1 s) only where its row is chosen.
    profiled = next((c for c in chosen if c.name == PROFILED and not c.skip), None)
    problem = nsys_problem() if profiled else ""
    return [Check(**{**vars(c), "skip": problem}) if c is profiled and problem else c for c in chosen]


def say_plan(checks: List[Check], scale: Scale, budget: float, measured: dict, spent: float = 0.0) -> None:
    total = sum(estimate_s(c, scale, measured) for c in checks)
    known = sum(1 for c in checks if c.name in measured and not c.skip)
    where = ("on this CPU (about 5 s a launch on an idle 2-core machine; CPU times say nothing about GPU times)"
             if scale is REHEARSAL else "on one H100 (a per-check table read from the code)")
    if known:
        where = f"{known} of them as measured in the last run here, the rest {where}"
    print(f"gpu_check: {len(checks)} checks; ESTIMATE {total / 60:.1f} min, {where}"
          + (f"; --budget {budget:g} s, {budget - spent:.0f} s of it left after the set-up" if budget else ""),
          flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    started = time.monotonic()  # --budget counts from here: the environment and the nsys probe take time too
    args = arguments(argv)
    missing = args.problems or missing_pieces()
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 2
    if args.rehearse:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: this process and every launch on the CPU
    from handler.runtime.cuda_build import LISTED_FIX, ask_smi, driver_cuda_version, gpus_hidden, header_problem
    from handler.runtime.devices import cuda_status, repeated_devices_problem
    from handler.runtime.precision.gpu import native_bf16
    if repeated_devices_problem():
        print(f"gpu_check: {repeated_devices_problem()}", file=sys.stderr)
        return 2
    gpus, why = (REHEARSAL_GPUS, "") if args.rehearse else cuda_status()
    smi = None if gpus or gpus_hidden() else ask_smi()
    driver = smi.broken_driver if smi else ""
    if smi and not driver and smi.gpus and driver_cuda_version() is None:  # listed, yet plain nvidia-smi fails
        driver = f"{header_problem() or 'nvidia-smi -L lists the GPUs but plain nvidia-smi shows no CUDA version'}" \
                 f"{LISTED_FIX}"
    if driver:
        print(f"gpu_check: {driver}", file=sys.stderr)
        return 2
    if not gpus:
        why = why.removesuffix("; running on CPU") or "none visible"
        print(f"gpu_check: no usable CUDA GPU ({why}); run it on a GPU machine, or --rehearse on a CPU",
              file=sys.stderr)
        return 2
    out = args.out
    env = {**environment(rehearsal=args.rehearse), "offline": args.offline}
    measured = measured_times(out, env)
    try:
        checks = checks_for(gpus, args, bf16=args.rehearse or native_bf16(), measured=measured)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    if not module_present("nvidia.dali"):
        print(no_dali_warning(), file=sys.stderr)
    second = [] if args.rehearse or gpus > 1 else [
        c for c in plan(2, dali=True, nsys=True, pytest_ok=True, tests=args.tests) if c.gpus > 1]
    for line in skip_lines([c for c in checks if "DALI" not in c.skip], gpus, second):  # DALI's: said above
        print(line, file=sys.stderr)
    scale = REHEARSAL if args.rehearse else GPU
    if args.list:
        for check in checks:
            skipped = f"  (skipped: {check.skip})" if check.skip else ""
            print(f"{estimate_s(check, scale, measured):5.0f} s  {check.name}{skipped}")
        return 0
    return run(checks, args, scale, out, env, measured, started)


def run(checks: List[Check], args: argparse.Namespace, scale: Scale, out: Path, env: dict,
        measured: Optional[dict] = None, started: Optional[float] = None) -> int:
    """The checks in turn; --budget counts from `started` (time.monotonic(); default now)."""
    spent = time.monotonic() - started if started is not None else 0.0
    say_plan(checks, scale, args.budget, measured or {}, spent)
    print(f"gpu_check: {env['gpus']} x {env['gpu']}; logs under {out}/runs", flush=True)
    # The rehearsal's CPU launches wait passively, as the suite's do (tests/conftest.py): with
    # spinning OpenMP threads beside one busy core, its SIGTERM check took over 240 s, not 22 s.
    hidden = {"CUDA_VISIBLE_DEVICES": "", "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")} \
        if args.rehearse else {}
    k, n = parse_part(args.part)
    stem = "gpu_check" if n == 1 else f"gpu_check_part{k}of{n}"
    runner = Runner(sys.executable, out, scale, hidden, budget_s=args.budget, spent_s=spent)
    done: List[Result] = []

    def after(results: List[Result]) -> None:
        done[:] = results
        write_reports(results, env, out, stem)

    def terminated(signum, frame):
        raise Terminated()
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        results = run_all(checks, runner, budget_s=args.budget, scale=scale, after=after, measured=measured,
                          spent_s=spent)
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the report short
        md, js = write_reports(stopped(checks, done), env, out, stem)
        print(f"\ngpu_check: STOPPED by SIGTERM after {len(done)} of {len(checks)} checks; the running one's "
              f"processes were ended; {md} and {js} hold the rows done", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(runner.data, ignore_errors=True)  # synthetic data: made again in seconds, 150 MB kept
    md, js = write_reports(results, env, out, stem)
    print(md.read_text(), end="")
    print(f"gpu_check: wrote {md} and {js}")
    if any(r.result == "fail" for r in results):
        return 1
    return 3 if any(r.result == "not run" for r in results) else 0


def stopped(checks: List[Check], done: List[Result]) -> List[Result]:
    """The rows done, the check SIGTERM stopped as failed, and the rest as not run."""
    if len(done) == len(checks):
        return done
    cut = [Result(checks[len(done)].name, "fail", 0.0, "stopped by SIGTERM: its processes were ended",
                  checks[len(done)].note)]
    rest = [Result(c.name, "not run", 0.0, "not started: gpu_check was stopped by SIGTERM", c.note)
            for c in checks[len(done) + 1:]]
    return [*done, *cut, *rest]


if __name__ == "__main__":
    sys.exit(main())
