"""Running one cell: scripts/launch.sh in its own process group, with its own folder.

Every cell goes through launch.sh, profiled (PROFILE=1) or not (PROFILE=0), so a
profiled matrix and a plain one train with exactly the same command line.
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..profiling.lab.metrics_file import metrics_problem
from ..profiling.record.metrics import Metrics
from ..profiling.record.parse import parse_metrics, parse_summary
from ..profiling.record.summary import Summary
from ..runtime.errors import UserError
from .cells import Cell

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "scripts" / "launch.sh"
STOP_GRACE_S = (10, 5)  # seconds a cell is given after SIGTERM, then after SIGKILL
# stderr lines that report progress or notes, not failure.
NOISE = ("note:", "launch:", "Generating '", "Generated:", "[1/1]")
WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")


@dataclass
class Outcome:
    cell: Cell
    status: str  # "ok", "failed", "skipped" or "interrupted"
    exit_code: Optional[int] = None
    error: str = ""
    metrics: Optional[Metrics] = None  # the cell's metrics JSON, parsed (a dict given is parsed here)
    profile: Optional[Summary] = None  # handler.profiling.report's summary JSON, parsed
    folder: str = ""
    command: str = ""
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        given: object = self.metrics
        if isinstance(given, dict):
            self.metrics = parse_metrics(given, f"cell {self.cell.name}'s metrics")
        given = self.profile
        if isinstance(given, dict):
            self.profile = parse_summary(given, f"cell {self.cell.name}'s summary")


@dataclass(frozen=True)
class Layout:
    """Where a cell's report, metrics and checkpoints go: its own folder of the comparison, or,
    with a `stamp`, the course kit's layout: nsight_logs/<mode>_<stamp>/gpu_<N>.nsys-rep and
    runs/<mode>_<stamp>/gpu_<N>/, reading the kit's data folders under `dataset`
    (cifar10 for dp and ddp, cifar10_images for ddp_dali) when they exist."""
    stamp: str = ""
    dataset: str = "dataset"

    def place(self, cell: Cell, folder: Path) -> dict[str, str]:
        if not self.stamp:
            return {"NSIGHT_LOG_DIR": str(folder), "NSIGHT_FILE_NAME": cell.slug, "CKPT_DIR": str(folder / "ckpt")}
        run = f"{cell.variant.label}_{self.stamp}"
        data = Path(self.dataset) / ("cifar10_images" if cell.variant.mode == "ddp_dali" else "cifar10")
        return {"NSIGHT_LOG_DIR": str(Path("nsight_logs") / run), "NSIGHT_FILE_NAME": f"gpu_{cell.count}",
                "CKPT_DIR": str(Path("runs") / run / f"gpu_{cell.count}"),
                **({"DATA_DIR": str(data)} if data.is_dir() else {})}

    def report(self, cell: Cell, folder: Path) -> Path:
        """Where `place` has nsys write the cell's report."""
        where = self.place(cell, folder)
        return Path(where["NSIGHT_LOG_DIR"]) / f"{where['NSIGHT_FILE_NAME']}.nsys-rep"


def cell_environment(cell: Cell, folder: Path, profile: bool, gpu_metrics: bool = False, *,
                     layout: Layout = Layout()) -> dict[str, str]:
    return {"MODE": cell.variant.mode, "NUM_GPUS": str(cell.count), "PROFILE": "1" if profile else "0",
            "GPU_METRICS": "1" if gpu_metrics else "0", **layout.place(cell, folder),
            "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}


def cell_command(cell: Cell, train_args: Sequence[str]) -> list[str]:
    # --no-progress first, so a cell's log is lines, not progress-bar redraws.
    return ["bash", str(LAUNCH), "--no-progress", *train_args, *cell.variant.args]


def reproduce_line(cell: Cell, folder: Path, profile: bool, train_args: Sequence[str], gpu_metrics: bool = False) -> str:
    env = cell_environment(cell, folder, profile, gpu_metrics)
    shown = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("MODE", "NUM_GPUS", "PROFILE", "GPU_METRICS")
                     if k != "GPU_METRICS" or gpu_metrics)
    args = shlex.join(["scripts/launch.sh", "--no-progress", *train_args, *cell.variant.args])
    return f"{shown} {args}"


def run_cell(cell: Cell, out: Path, *, profile: bool, train_args: Sequence[str], timeout_s: float = 0,
             gpu_metrics: bool = False, layout: Layout = Layout()) -> Outcome:
    """Train one cell; any failure becomes the Outcome's status, never an exception
    (except Ctrl-C, which stops the cell and goes on up)."""
    folder = out / "cells" / cell.slug
    folder.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(cell, "failed", folder=str(folder.relative_to(out)),
                      command=reproduce_line(cell, folder, profile, train_args, gpu_metrics))
    env = cell_environment(cell, folder, profile, gpu_metrics, layout=layout)
    started = time.perf_counter()
    with open(folder / "stdout.log", "w") as stdout, open(folder / "stderr.log", "w") as stderr:
        # Its own session: a timeout or Ctrl-C can then stop the ranks and nsys too.
        proc = subprocess.Popen(cell_command(cell, train_args), cwd=os.getcwd(), stdout=stdout, stderr=stderr,
                                env={**os.environ, **env},
                                start_new_session=True)
        try:
            outcome.exit_code = proc.wait(timeout=timeout_s or None)
        except subprocess.TimeoutExpired:
            _stop(proc)
            outcome.exit_code, outcome.error = proc.returncode, f"timed out after {timeout_s:g} s (--timeout)"
        except KeyboardInterrupt:
            _stop(proc)
            raise
    outcome.wall_s = time.perf_counter() - started
    results = Path(env["NSIGHT_LOG_DIR"]) / env["NSIGHT_FILE_NAME"]
    try:
        metrics = _read_json(results.with_name(results.name + ".metrics.json"))
        if metrics is not None and (problem := metrics_problem(metrics)):
            raise UserError(f"its metrics JSON {problem}")
        outcome.metrics = parse_metrics(metrics, "its metrics JSON") if metrics is not None else None
        summary = _read_json(results.with_name(results.name + ".summary.json")) if profile else None
        outcome.profile = parse_summary(summary, "its summary JSON") if summary is not None else None
    except UserError as err:  # the cell ran, but what it wrote cannot be read: it failed, saying why
        outcome.metrics = outcome.profile = None
        outcome.error = str(err)
    if outcome.exit_code == 0 and outcome.metrics and outcome.metrics.epochs:
        outcome.status = "ok"
    elif not outcome.error:
        outcome.error = last_error_line((folder / "stderr.log").read_text(errors="replace")) \
            or ("no metrics were written" if outcome.exit_code == 0 else "no error message")
    return outcome


def skipped(cell: Cell, reason: str) -> Outcome:
    return Outcome(cell, "skipped", error=reason)


def last_error_line(text: str) -> str:
    """The last stderr line that is not progress or a note: usually the one-line error,
    or the exception line that ends a traceback."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines()]
    lines = [line for line in lines if line and not line.startswith(NOISE) and not WARNING.match(line)]
    return lines[-1][:300] if lines else ""


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM the cell's process group, then SIGKILL what is left after 10 s."""
    for sig, grace in zip((signal.SIGTERM, signal.SIGKILL), STOP_GRACE_S):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
