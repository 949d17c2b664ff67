"""A rank stopped mid-epoch on NCCL is named by the heartbeat, not aborted by NCCL's watchdog.

The CPU twin (tests/faults/test_faults.py) proves it on gloo. On NCCL the group's timeout
is --dist-timeout + 30 s (handler/DDP/utils.py: group_timeout_s), so the heartbeat's limit
(a third of --dist-timeout) comes first and NCCL's watchdog never tears rank 0 down with
SIGABRT before it says which peer went silent. `gpus(2)`: skipped below 2 GPUs.
"""
import os
import signal
import socket

import pytest

from tests.faults.test_faults import (LONG, NAMED_WITHIN, STOP_TIMEOUT, alive, descendants, finish, killer_cleanup,  # noqa: F401 - a fixture
                                        none_alive, output, ranks_of, start, wait_for_text)
from tests.faults.test_stalled_rank import stalled_loader_run

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]


def test_sigstopped_rank_is_named_on_nccl(data_root, tmp_path):
    proc = start(["--mode", "ddp", "--num_gpu", 2, "--data", data_root, "--ckpt", tmp_path, "--epochs", 200,
                  "--dist-timeout", STOP_TIMEOUT, *LONG], tmp_path)
    ranks = []
    try:
        wait_for_text(proc, "steps/epoch", budget=60)
        ranks = ranks_of(proc.pid)
        assert len(ranks) == 2
        family = descendants(proc.pid)
        os.kill(ranks[1], signal.SIGSTOP)
        named_after = wait_for_text(proc, "lost rank 1", budget=NAMED_WITHIN)
        finish(proc, budget=30)
    finally:
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = output(proc)
    proc.log.close()
    assert proc.returncode not in (0, None) and named_after < NAMED_WITHIN
    assert "SIGABRT" not in text and "Watchdog caught collective operation timeout" not in text
    lines = [line for line in text.splitlines() if "lost rank" in line]
    assert len(lines) == 1 and lines[0].startswith("rank 0 (")
    assert f"lost rank 1 ({socket.gethostname()})" in lines[0]
    assert (tmp_path / "flight_recorder" / "rank_0").stat().st_size > 0
    assert none_alive(family), "orphaned processes left behind"


def test_a_rank_whose_loader_worker_is_stopped_is_named_with_its_phase_on_nccl(data_root, tmp_path, killer_cleanup):
    """The CPU twin's case on NCCL (tests/faults/test_stalled_rank.py): the verdict is the
    heartbeat thread's, so rank 0 names rank 1 and 'data' though its collectives never return
    to Python; NCCL's watchdog (--dist-timeout + 30 s) never fires first."""
    text = stalled_loader_run(data_root, tmp_path, killer_cleanup, start_budget=60)
    assert "SIGABRT" not in text and "Watchdog caught collective operation timeout" not in text
