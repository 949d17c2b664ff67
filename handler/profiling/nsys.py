"""The nsys command line: finding it and exporting a report to SQLite."""
import os
import shutil
import subprocess
from pathlib import Path

from handler.runtime.errors import UserError

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # .qdrep: nsys before 2021.4
INSTALL_HINT = "install it with scripts/install_nsys.sh (or from https://developer.nvidia.com/nsight-systems)"


def nsys_executable() -> str:
    path = shutil.which("nsys")
    if path is None:
        raise UserError(f"nsys is not on PATH; {INSTALL_HINT}, or pass an exported .sqlite instead")
    return path


def nsys_version() -> str | None:
    """'2022.4.2.1-df9881f' from 'NVIDIA Nsight Systems version 2022.4.2.1-df9881f'."""
    path = shutil.which("nsys")
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return out.rsplit(" ", 1)[-1] or None


def sqlite_export(report: Path, out_dir: Path) -> Path:
    """The report as SQLite in out_dir; an export newer than the report, there or next to
    the report, is reused."""
    if not report.is_file():
        raise UserError(f"{report} does not exist; record one with scripts/launch.sh "
                        "or pass the path of an .nsys-rep file")
    if report.suffix == ".sqlite":
        return report
    if report.suffix not in REPORT_SUFFIXES:
        raise UserError(f"{report} is not an Nsight Systems report; pass the .nsys-rep "
                        "written by nsys profile (or its .sqlite export)")
    target = out_dir / f"{report.stem}.sqlite"
    for existing in (report.with_suffix(".sqlite"), target):
        if existing.is_file() and existing.stat().st_mtime >= report.stat().st_mtime:
            return existing
    out_dir.mkdir(parents=True, exist_ok=True)
    # Export under a temporary name so an interrupted export is never reused as fresh.
    partial = out_dir / f"{report.stem}.partial.sqlite"
    result = subprocess.run(
        [nsys_executable(), "export", "--type=sqlite", "--force-overwrite=true", "--quiet=true",
         f"--output={partial}", str(report)], capture_output=True, text=True)
    if result.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        lines = (result.stderr + result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"nsys export exited with {result.returncode}"
        raise UserError(f"nsys could not read {report} ({reason}); pass an .nsys-rep written "
                        "by a finished nsys profile run (a crashed one leaves only a .qdstrm)")
    os.replace(partial, target)
    return target
