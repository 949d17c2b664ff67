"""Shared by the tests that run Nsight Systems.

nsys is optional on a laptop but required in CI (DESIGN.md §6): without it these tests
skip, unless CI=true, where they fail so that a broken CI image cannot pass silently.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NSYS_OPTIONS = REPO / "scripts" / "nsys_options.sh"


def require_nsys() -> str:
    """Path of nsys; skips the test without it, or fails it when CI=true."""
    path = shutil.which("nsys")
    if path:
        return path
    message = "nsys is not on PATH; install it with scripts/install_nsys.sh"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true requires it)")
    pytest.skip(message)


def profile_options() -> list[str]:
    """The `nsys profile` options scripts/launch.sh uses, read from their one source."""
    out = subprocess.run(["bash", "-c", f'source "{NSYS_OPTIONS}"; printf "%s\\n" "${{NSYS_PROFILE_OPTS[@]}}"'],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def profile(command: list[str], output: Path, timeout: float = 120) -> Path:
    """Run command under nsys with the lab's options; returns the .nsys-rep."""
    result = subprocess.run([require_nsys(), "profile", *profile_options(), f"--output={output}", *command],
                            capture_output=True, text=True, timeout=timeout)
    report = output.with_name(output.name + ".nsys-rep")
    assert result.returncode == 0 and report.is_file(), result.stdout[-2000:] + result.stderr[-2000:]
    return report


def path_without_nsys(tmp_path: Path) -> str:
    """$PATH in which nsys cannot be found: each folder holding it is replaced by links
    to everything else in that folder (on merged-/usr systems /bin and /usr/bin both hold it)."""
    entries = []
    for i, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        folder = Path(entry)
        if (folder / "nsys").exists():
            farm = tmp_path / f"path-without-nsys-{i}"
            farm.mkdir(exist_ok=True)
            for tool in folder.iterdir():
                if tool.name != "nsys" and not (farm / tool.name).is_symlink():
                    (farm / tool.name).symlink_to(tool)
            folder = farm
        entries.append(str(folder))
    return os.pathsep.join(entries)
