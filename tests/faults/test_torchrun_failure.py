"""torchrun through handler/runtime/torchrun.py (as scripts/slurm/train.sbatch launches): a
worker that stops with its own one line is followed by one line, not torchrun's traceback."""
import sys

from handler.runtime.torchrun import failure_line
from tests.conftest import ROOT, run_process

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
