"""scripts/slurm/nsys_node.sh, each node's task of a profiled Slurm job (train.sbatch, PROFILE=1):
an nsys that never started the program (nsys 2022.4's own session failure) runs once more on
that node, instead of srun's --kill-on-bad-exit ending the whole job for it. nsys is a stand-in
here (its failure cannot be caused at will); the program is the real handler.runtime.torchrun,
which tells the wrapper it started."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT

NODE = ROOT / "scripts" / "slurm" / "nsys_node.sh"
FAKE_NSYS = """#!/bin/bash
# nsys stand-in. FAKE_NSYS: fail (its session failure, every time), fail_once (the first time
# only), stopped (ended by SIGTERM before the program started: 143), else run the program.
[[ $1 == profile ]] || exit 1
shift
while [[ $1 == -* ]]; do shift; done
tries="$FAKE_NSYS_TRIES"; echo x >>"$tries"
case "${FAKE_NSYS:-}" in
    fail) echo "Local Endpoint is not available." >&2; exit 1 ;;
    fail_once) [[ $(wc -l <"$tries") == 1 ]] && { echo "End of file" >&2; exit 1; } ;;
    stopped) exit 143 ;;
esac
exec "$@"
"""
# The real torchrun wrapper, as train.sbatch starts it; --help ends it at once, after it told
# the wrapper it started.
TORCHRUN_HELP = [sys.executable, "-m", "handler.runtime.torchrun", "--help"]


def node(tmp_path, program, mode):
    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS)
    fake.chmod(0o755)
    env = {**os.environ, "FAKE_NSYS": mode, "FAKE_NSYS_TRIES": str(tmp_path / "tries"), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(["bash", NODE, fake, "profile", "--trace=nvtx", f"--output={tmp_path}/r", *program],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    tries = (tmp_path / "tries").read_text().count("x") if (tmp_path / "tries").exists() else 0
    return run, tries


def test_an_nsys_that_failed_to_start_the_program_once_runs_once_more_and_the_task_succeeds(tmp_path):
    run, tries = node(tmp_path, TORCHRUN_HELP, "fail_once")
    assert run.returncode == 0 and tries == 2, run.stderr
    assert "exited 1 before the training started (its message is above); trying once more" in run.stderr
    assert run.stdout.count("usage:") == 1  # the program ran once


def test_an_nsys_that_never_starts_the_program_fails_the_task_after_one_more_try(tmp_path):
    run, tries = node(tmp_path, TORCHRUN_HELP, "fail")
    assert run.returncode == 1 and tries == 2, run.stderr
    assert run.stderr.count("trying once more") == 1


@pytest.mark.parametrize("mode, program, status", [
    ("stopped", TORCHRUN_HELP, 143),  # Slurm's SIGTERM before the program started: not tried again
    ("run", [sys.executable, "-m", "handler.runtime.torchrun", "--no-such-option"], 2),  # it ran, and failed
])
def test_a_stopped_nsys_or_a_failed_program_is_never_run_again(tmp_path, mode, program, status):
    run, tries = node(tmp_path, program, mode)
    assert run.returncode == status and tries == 1, run.stderr
    assert "trying once more" not in run.stderr


def test_slurms_sigterm_reaches_the_program_and_the_wrapper_waits_for_its_save(tmp_path):
    """scancel's SIGTERM reaches every process of the task (here: the process group): the program
    saves and exits by itself, the wrapper waits for it and exits with its status, and runs nothing again."""
    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS)
    fake.chmod(0o755)
    saved = tmp_path / "saved"
    program = ("import signal, sys, time\n"
               "def stop(*_):\n"
               f"    time.sleep(1); open({str(saved)!r}, 'w').close(); sys.exit(143)\n"
               "signal.signal(signal.SIGTERM, stop)\n"
               "print('ready', flush=True)\n"
               "while True: time.sleep(0.05)\n")
    env = {**os.environ, "FAKE_NSYS": "run", "FAKE_NSYS_TRIES": str(tmp_path / "tries")}
    proc = subprocess.Popen(["bash", NODE, fake, "profile", sys.executable, "-c", program], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143 and saved.exists(), err
    assert "trying once more" not in err and (tmp_path / "tries").read_text().count("x") == 1


def test_a_tmpdir_it_cannot_write_is_one_line_and_nothing_runs(tmp_path):
    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS)
    fake.chmod(0o755)
    run = subprocess.run(["bash", NODE, fake, "profile", *TORCHRUN_HELP], capture_output=True, text=True,
                         env={**os.environ, "TMPDIR": "/proc", "FAKE_NSYS_TRIES": str(tmp_path / "tries")}, timeout=30)
    assert run.returncode == 2 and not (tmp_path / "tries").exists(), run.stderr
    assert run.stderr.strip().splitlines() == [
        f"train.sbatch: cannot make a folder in TMPDIR=/proc on {socket.gethostname()}; point TMPDIR at a writable folder"]
