"""What scripts/gpu_check.py asks of the machine before it runs: whether this Python has every
import the trainer needs, which optional pieces are there (DALI, pytest, an nsys that makes
reports, a second GPU), one line per missing piece naming the rows it skips, and the seconds
each check took in the last run in the same --out. docs/GPU_CHECK.md."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from handler.runtime.devices import TRAINER_NEEDS, module_present
from scripts.gpu_check_plan import Check

ROOT = Path(__file__).resolve().parents[1]
NSYS_PROBE_TIMEOUT_S = 150  # a tiny report takes about 1 s; nsys_options.sh stops it at 120 s


def missing_pieces() -> List[str]:
    """One line per import the trainer needs (handler/runtime/devices.py's TRAINER_NEEDS) and this
    Python lacks, which would fail every row with a traceback; empty when it has them all."""
    return [f"gpu_check: {sys.executable} cannot import {module}, which train_cifar.py needs (every check "
            f"would fail): pip install {package}, or name a Python that has it with PYTHON=" for module, package
            in TRAINER_NEEDS.items() if not module_present(module)]


def out_problem(out: Path) -> str:
    """The one line for an --out folder gpu_check could not create or write in (a file, a path
    under a file, a folder without write permission), else "". Creates nothing."""
    folder = out
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        where = "is a file" if folder == out else f"is under {folder}, which is a file"
        return f"gpu_check: --out {out} {where}; name a folder (it is made if missing)"
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        return f"gpu_check: --out {out}: cannot write in {folder} ({err.strerror}); name a folder you can write"
    return ""


def no_dali_warning() -> str:
    from handler.runtime.cuda_build import dali_install_hint
    return f"gpu_check: WARNING: NVIDIA DALI is not installed: SKIPPING every ddp_dali check ({dali_install_hint()})"


def nsys_problem() -> str:
    """"" when the nsys on PATH makes a report of a tiny run (scripts/nsys_options.sh's
    nsys_makes_reports), else why not, for the profiled row's skip."""
    probe = f'source "{ROOT / "scripts" / "nsys_options.sh"}" && nsys_makes_reports'
    try:
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=NSYS_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"nsys made no report of a tiny run within {NSYS_PROBE_TIMEOUT_S} s"
    return "" if done.returncode == 0 else (done.stdout.strip() or done.stderr.strip() or "nsys made no report")


def skip_lines(checks: List[Check], gpus: int, second_gpu_pass: List[Check]) -> List[str]:
    """One line per missing piece (each distinct skip reason), naming the rows it skips; on
    one GPU, one more for the 2-GPU pass it leaves out."""
    by_reason: Dict[str, List[str]] = {}
    for check in checks:
        if check.skip:
            by_reason.setdefault(check.skip, []).append(check.name)
    lines = [f"gpu_check: skipping {len(names)} row(s) ({', '.join(names)}): {reason}"
             for reason, names in by_reason.items()]
    if gpus == 1 and second_gpu_pass:
        lines.append(f"gpu_check: one GPU: the 2-GPU pass ({len(second_gpu_pass)} rows: "
                     f"{', '.join(c.name for c in second_gpu_pass)}) needs a second GPU and is not run")
    return lines


def measured_times(out: Path, env: dict) -> Dict[str, float]:
    """Seconds per check from the reports already in `out` made on the same kind of machine
    (the same GPU, or a rehearsal), the newest report winning: --budget and --part use them
    instead of the table's estimates."""
    times: Dict[str, float] = {}
    reports = sorted(out.glob("gpu_check*.json"), key=lambda path: path.stat().st_mtime)
    for report in reports:
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            continue
        same = data.get("env", {}).get("rehearsal") == env["rehearsal"] and data["env"].get("gpu") == env["gpu"]
        for row in data.get("checks", []) if same else []:
            if row.get("result") == "pass" and row.get("seconds", 0) > 0:  # a failure may end early
                times[row["check"]] = float(row["seconds"])
    return times
