"""A rank that is alive but stuck (its data loader hangs) is named with its phase, in one line.

The stuck rank still beats, so no peer is lost; it publishes where it is instead
(handler/runtime/phases.py HERE, through handler/DDP/peers.py), and the first rank that waits
on it for --dist-timeout names it. Its own loader bound (handler/data/loaders.py, twice
--dist-timeout) is the backstop; whichever speaks first, the other stays quiet.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from handler.DDP import peers
from handler.data.loaders import DeviceLoader
from handler.runtime import dist, stopping
from handler.runtime.errors import Stalled, StopRequested
from handler.runtime.phases import Position
from tests.conftest import ROOT, SMALL
from tests.dist_workers import alive
from tests.faults.test_faults import (descendants, finish, killer_cleanup, none_alive, output, ranks_of,  # noqa: F401 - killer_cleanup is a fixture
                                      start, wait_for_text)
from tests.faults.test_peers_errors import fresh_report, real_store  # noqa: F401 - fresh_report is a fixture

# No validation set: every loader worker alive mid-run is a training one.
STEADY = [*SMALL, "--batch-size", 32, "--valid-size", 0, "--lr", 0.05, "--workers", 1]
TIMEOUT = 6


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@contextmanager
def stopped(pids):
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)


def ranks_and_workers(pid: int):
    """The ranks (no rank's children) and rank 1's loader workers (its children, forked with
    its command line)."""
    family = ranks_of(pid)  # the ranks, and their loader workers once started
    ranks = sorted(p for p in family if parent(p) not in family)
    return ranks, [p for p in family if parent(p) == ranks[-1]]


def stalled_loader_run(data_root, tmp_path, procs: list, start_budget: float) -> str:
    """A 2-rank ddp run whose rank 1 loader worker is stopped mid-epoch: rank 0 alone names
    rank 1 and 'data' within --dist-timeout + 30 s, and the job ends with nothing left. The output."""
    proc = start(["--mode", "ddp", "--num_gpu", 2, "--data", data_root, "--ckpt", tmp_path, "--epochs", 30,
                  "--dist-timeout", TIMEOUT, *STEADY], tmp_path)
    procs.append(proc)
    wait_for_text(proc, "steps/epoch", budget=start_budget)
    time.sleep(1.0)  # mid-epoch
    ranks, workers = ranks_and_workers(proc.pid)
    assert len(ranks) == 2 and workers, (ranks, workers)
    family = descendants(proc.pid)
    with stopped(workers):  # a stopped worker outlives its rank: killed here at the end
        named_after = wait_for_text(proc, "rank 1 (", budget=TIMEOUT + 30)
        finish(proc, budget=20)
    assert none_alive(family), "orphaned processes left behind"
    assert proc.returncode == 2
    assert named_after < TIMEOUT + 30, f"named {named_after:.1f} s after the stop"
    said = [line for line in output(proc).splitlines() if line.startswith("rank ")]
    assert len(said) == 1, output(proc)[-3000:]
    line = said[0]
    assert line.startswith("rank 0 (")
    assert f"rank 1 ({socket.gethostname()}) is stuck in 'data' at epoch " in line and "(its data loader)" in line
    assert "rank 0 waits in '" in line and f"--dist-timeout {TIMEOUT} s" in line
    assert f"flight recorder: {tmp_path / 'flight_recorder' / 'rank_0'}" in line
    return output(proc)


@pytest.mark.slow  # waits out a --dist-timeout of 6 s on 2 ranks: CI's slow step (pytest.ini)
def test_a_rank_whose_loader_worker_is_stopped_is_named_with_its_phase_in_one_line(
        data_root, tmp_path, killer_cleanup):
    stalled_loader_run(data_root, tmp_path, killer_cleanup, start_budget=15)


class Stuck(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(2)  # a read far longer than the bound below (short: shutting the loader down waits for it)
        return torch.zeros(3, 32, 32), 0


def test_a_dataloader_past_its_bound_stops_its_rank_naming_the_loader():
    loader = DeviceLoader(DataLoader(Stuck(), batch_size=2, num_workers=1, timeout=0.5), torch.device("cpu"))
    with pytest.raises(Stalled, match=r"^stuck in '.*': its data loader gave no batch for 0.5 s \(the bound is "
                                      r"2 x --dist-timeout\)"):
        next(iter(loader))


# Rank 0 waiting for a batch for 100 s, with --dist-timeout 1 (the loader's bound 2 s), its
# main thread blocked where no timeout of the DataLoader reaches: its heartbeat ends it.
WAITS_FOR_DATA = """
import datetime, sys, time
import torch.distributed as tdist
from handler.DDP import peers
from handler.runtime import phases
store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
phases.at_step(0, 7)
phases.entered("data")
phases.HERE.since -= 100
peers.Heartbeat("127.0.0.1", store.port, 0, 2, 1)
time.sleep(30)
print("the heartbeat never gave up")
"""


def test_a_rank_waiting_for_a_batch_past_the_bound_is_ended_by_its_heartbeat_naming_the_loader():
    rank = subprocess.run([sys.executable, "-c", WAITS_FOR_DATA], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rank.returncode == 2, rank.stdout + rank.stderr
    assert re.fullmatch(r"rank 0 \(.*\): stuck in 'data' at epoch 0 step 7: its data loader gave no batch for 10\d(\.\d)? s "
                        r"\(the bound is 2 x --dist-timeout\); a loader worker hangs .*; the other ranks stop too",
                        rank.stderr.strip().splitlines()[-1]), rank.stderr


def test_the_ranks_furthest_back_are_named_with_their_phase_and_for_how_long(fresh_report):
    now = time.time()
    where = {0: Position(0, 8, "backward", now - 12), 1: Position(0, 8, "data", now - 31),
             2: Position(0, 8, "backward", now - 12)}
    assert peers.behind(where) == [1]
    assert peers.stuck_line(where, [1], 0, 30) == ("rank 1 (node2) is stuck in 'data' at epoch 0 step 8 for 31 s "
                                                   "(its data loader); rank 0 waits in 'backward' at epoch 0 step 8 "
                                                   "(--dist-timeout 30 s)")
    # Ranks in step with each other are nobody's fault; an earlier step, or set-up, is behind.
    assert peers.behind({0: Position(1, 3, "data", now), 1: Position(1, 3, "data", now - 50)}) == []
    assert peers.behind({0: Position(1, 0, "data", now), 1: Position(0, 99, "optimizer", now)}) == [1]
    assert peers.behind({0: Position(0, 0, "data", now), 1: Position()}) == [1]
    assert peers.behind({0: Position(0, 0, "checkpoint", now), 1: Position(0, 9, "optimizer", now)}) == [1]
    assert Position.parse(Position(2, 5, "h2d", 7.5).text()).order() == Position(2, 5, "h2d", 7.5).order()


def test_only_the_first_rank_to_explain_a_stop_says_it(fresh_report, monkeypatch):
    from handler.DDP.store_link import BoundedStore
    monkeypatch.setitem(os.environ, "TORCHELASTIC_RESTART_COUNT", "0")
    store = real_store()
    links = [BoundedStore("127.0.0.1", store.port, 5.0) for _ in range(2)]
    try:
        assert [peers.first_to_explain(link) for link in links] == [True, False]
        assert peers.first_to_explain(None)  # no store to ask: say it
        monkeypatch.setitem(os.environ, "TORCHELASTIC_RESTART_COUNT", "1")  # an elastic restart starts afresh
        assert peers.first_to_explain(links[1])
    finally:
        for link in links:
            link.close()
    assert dist.HOSTS[1] == "node2"


def test_a_rank_its_launcher_is_ending_exits_quietly_whatever_breaks_meanwhile(monkeypatch):
    # Under torchrun, a stuck rank's SIGTERM also ends its loader workers; the DataLoader then
    # raised "worker ... killed by signal" as a traceback beside the one line that explained the stop.
    monkeypatch.setattr(stopping, "_received", signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        with stopping.quiet_once_ended():
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated.")
    assert ended.value.code == 128 + signal.SIGTERM
    with pytest.raises(StopRequested):  # the graceful stop keeps its own exit
        with stopping.quiet_once_ended():
            raise StopRequested(signal.SIGTERM)
    monkeypatch.setattr(stopping, "_received", 0)
    with pytest.raises(RuntimeError):  # without a stop signal a failure is still a failure
        with stopping.quiet_once_ended():
            raise RuntimeError("a real bug")
