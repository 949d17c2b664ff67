"""An install that cannot fit stops before it starts, in one line (scripts/free_space.sh).

The defect: CI's box had 2.3 GiB free, and setup.sh, the old-torch smoke and the laptop report
each ran pip into it: three pip tracebacks ("No space left on device") and a half-made venv each.
Here each script runs from a copy of the checkout on a 64 MiB tmpfs, mounted in a mount
namespace of the test's own (so nothing outside it sees the mount): a real small disk, nothing
stood in for."""
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

FILES = ["scripts/setup.sh", "scripts/free_space.sh", "scripts/smoke_old_torch.sh",
         "scripts/laptop_report.sh", "handler/runtime/cuda_build.py", "requirements.txt",
         "requirements-test.txt", "requirements-oldtorch.txt", "requirements-report.txt"]


def on_a_small_disk(tmp_path, command: str, tmpdir_on_it: bool) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -m (root), as the cluster tests do")
    disk = tmp_path / "disk"
    disk.mkdir()
    copies = " && ".join(f"mkdir -p $(dirname r/{f}) && cp {ROOT / f} r/{f}" for f in FILES)
    tmpdir = f"TMPDIR={disk}/r" if tmpdir_on_it else f"TMPDIR={tmp_path}"
    script = (f"mount -t tmpfs -o size=64m tmpfs {disk} && cd {disk} && {copies} && cd r "
              f"&& CUDA_VISIBLE_DEVICES= {tmpdir} {command}; echo \"left: $(ls -A)\"")
    return subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command, who, gib", [("bash scripts/setup.sh requirements-test.txt", "setup", 10),
                                               ("bash scripts/smoke_old_torch.sh", "smoke", 10),
                                               ("bash scripts/laptop_report.sh", "laptop report", 2)])
def test_an_install_without_room_is_one_line_and_makes_no_venv(tmp_path, command, who, gib):
    done = on_a_small_disk(tmp_path, command, tmpdir_on_it=True)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{who}: not enough disk space:"), lines
    assert f"needs about {gib} GiB" in lines[0] and "GiB free" in lines[0] and "TMPDIR" in lines[0], lines
    assert ".venv" not in done.stdout.split("left:")[-1], done.stdout  # no half-made venv


def test_with_pip_s_downloads_elsewhere_only_the_venv_s_room_is_asked(tmp_path):
    """TMPDIR on another disk: the venv's own 7 GiB is what this small disk lacks."""
    done = on_a_small_disk(tmp_path, "bash scripts/setup.sh", tmpdir_on_it=False)
    assert ".venv needs about 7 GiB" in done.stderr and "pip's downloads" not in done.stderr, done.stderr
