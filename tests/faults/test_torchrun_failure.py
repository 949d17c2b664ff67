"""torchrun through handler/runtime/torchrun.py (as scripts/slurm/train.sbatch launches): a
worker that stops with its own one line is followed by one line, not torchrun's traceback."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handler.runtime.torchrun import failure_line
from tests.conftest import ROOT, SLACK, run_process

WORKER = """import os, sys, time
if os.environ["RANK"] == "0":
    print("rank 0 (host): no room to save a checkpoint in /x", file=sys.stderr)
    sys.exit(2)
time.sleep(60)  # rank 1 waits, as a rank blocked in a collective would
"""


def test_a_worker_failing_in_one_line_ends_torchrun_in_one_more_line_with_its_status(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = run_process([sys.executable, "-m", "handler.runtime.torchrun", "--nproc-per-node", 2,
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", worker], budget=10, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("torchrun: ")]
    assert len(ours) == 1 and ours[0].startswith("torchrun: rank 0 (local rank 0 on "), proc.stderr
    assert "exited with code 2 first; its own output above says why" in ours[0]


def test_a_worker_killed_by_a_signal_gives_128_plus_its_number():
    line, status = failure_line(1, 1, -9, "node2")
    assert status == 137 and line.startswith("torchrun: rank 1 (local rank 1 on node2) was killed by SIGKILL first")


@pytest.mark.slow  # 22 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_torchrun_told_to_stop_says_so_in_one_line_without_a_traceback(tmp_path):
    """Slurm ends the step on the other nodes with SIGTERM once one node's rank failed; that
    torchrun printed torch's SignalException traceback after the failing rank's one line."""
    started = tmp_path / "started"
    worker = tmp_path / "worker.py"
    worker.write_text(f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "handler.runtime.torchrun", "--nproc-per-node", "1",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(worker)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_worker(started, proc, budget=15)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=SLACK * 10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "SignalException" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("torchrun (")]
    assert len(ours) == 1 and "stopped by SIGTERM; its workers were stopped with it" in ours[0], err


def wait_for_worker(started: Path, proc: subprocess.Popen, budget: float) -> None:
    """Until torchrun's worker runs: torch installs torchrun's SIGTERM handler before it starts
    the workers, so a signal from then on meets the handler. Any child of torchrun is not
    enough: one seen during its start-up took the signal before the handler was there
    (exit -15 instead of 143, in one suite run of many)."""
    deadline = time.time() + SLACK * budget
    while not started.exists():
        assert proc.poll() is None, f"torchrun ended with {proc.returncode} before its worker started"
        assert time.time() < deadline, f"torchrun started no worker within {SLACK * budget:.0f} s"
        time.sleep(0.1)
