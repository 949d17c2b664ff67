"""Rare turns of handler/DDP/{utils,run,leftovers}.py, reached without training: a stop request
whose rank dies of a signal before it could save, torchrun's elastic restarts left sharing
the rendezvous store, and what a job leaves running."""
import os
import signal
import subprocess
import threading
import time

import pytest

from handler.DDP import leftovers
from handler.DDP.run import _torchrun_preparation
from handler.DDP.utils import run_process
from handler.train.config import Config
from tests.dist_workers import dies_when_stopped


@pytest.mark.slow  # 12 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_rank_killed_while_stopping_says_the_last_checkpoint_is_unchanged(tmp_path, capsys):
    def stop_once_every_rank_is_up():
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(os.listdir(tmp_path)) == 2:  # else run_process failed, its handler is gone: no signal
            os.kill(os.getpid(), signal.SIGTERM)  # run_process passes it on to the ranks

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_once_every_rank_is_up, daemon=True).start()
    with pytest.raises(SystemExit) as stopped:
        run_process(dies_when_stopped, str(tmp_path), nprocs=2, use_cuda=False)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM before rank " in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # run_process gave the handler back


def test_elastic_restarts_sharing_the_rendezvous_store_are_warned_about(tmp_path, monkeypatch, capsys):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "TORCHELASTIC_MAX_RESTARTS": "1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    cfg = Config(dataset="synthetic", data=str(tmp_path / "data"), ckpt=str(tmp_path / "ckpt"),
                 synthetic_train=10, synthetic_test=1)
    _torchrun_preparation(cfg)
    assert "restarted workers can read stale rendezvous keys" in capsys.readouterr().err
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    _torchrun_preparation(cfg)
    assert "stale rendezvous keys" not in capsys.readouterr().err


def test_a_process_of_the_job_left_holding_its_resource_tracker_is_ended_with_the_tracker(capsys):
    """Every process a job starts inherits the resource tracker's pipe, and the tracker exits
    only once none holds it. One that outlived its rank (a killed rank's loader worker, here
    stopped as one stuck in a read would be; a sleep given the pipe stands in for it) is ended,
    and the tracker with it, instead of both outliving the launcher."""
    from multiprocessing import resource_tracker
    holder = subprocess.Popen(["sleep", "600"], pass_fds=(resource_tracker.getfd(),))
    tracker = leftovers.helpers()[1]
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        start = time.monotonic()
        leftovers.end_job({}, (leftovers.helpers()[0], None))  # this tracker only
        took = time.monotonic() - start
        assert holder.wait(timeout=30) == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait()
    assert leftovers.started_at(tracker) is None and leftovers.helpers()[1] is None  # ended and reaped
    assert took < 20, f"end_job took {took:.0f} s"
    assert capsys.readouterr().err == ""


def test_a_rank_still_running_past_the_bound_after_its_fork_server_died_is_killed_and_named(monkeypatch, capsys):
    """Such a rank stops on its parent-death signal and saves; one that does not (here a sleep
    standing in for it) is killed once the bound has passed, and named."""
    monkeypatch.setattr(leftovers, "STOP_WAIT_S", 1)
    rank = subprocess.Popen(["sleep", "600"])
    try:
        leftovers.end_job({rank.pid: leftovers.started_at(rank.pid)}, leftovers.helpers())  # no helper of its own
        assert rank.wait(timeout=30) == -signal.SIGKILL
    finally:
        rank.kill()
        rank.wait()
    assert f"rank process {rank.pid} had not stopped 1 s after its fork server died; killed" in capsys.readouterr().err
