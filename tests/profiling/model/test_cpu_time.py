"""Each epoch's CPU time in the metrics JSON (handler/data/cpu_time.py, docs/METRICS.md): the
rank's own and its loader's, read from the process and from /proc, never estimated."""
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from handler.data import cpu_time
from tests.conftest import PROCESSES, read_metrics


class Busy(Dataset):
    """Items that cost the worker CPU time."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.zeros(64, 64)
        until = time.process_time() + 0.02
        while time.process_time() < until:
            x = x + 1.0
        return x[0, 0]


@pytest.mark.parametrize("mode", ["ddp", pytest.param("ddp_dali", marks=pytest.mark.slow)])  # ddp_dali's two-epoch run: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_real_runs_metrics_carry_each_epochs_cpu_time_per_step_and_rank(mode, two_epoch_run):
    _, folder = two_epoch_run(mode)
    m = read_metrics(folder / "metrics.json")
    cores = m["env"]["cpu_cores"]
    for e in m["epochs"]:
        c = e["cpu_time"]
        assert c["ranks"] == PROCESSES[mode] and c["steps"] > 0
        assert c["rank_ms_per_step"] > 0 and c["loader_ms_per_step"] >= 0
        assert c["loader_ms_per_step"] == pytest.approx(c["workers_ms_per_step"] + c["dali_ms_per_step"])
        # what the ranks' processes spent cannot exceed the cores they share over the epoch's wall time
        spent = (c["rank_ms_per_step"] + c["dali_ms_per_step"]) * c["steps"] * c["ranks"] / 1e3
        assert spent <= e["time_s"] * cores * 1.1 + 0.05
        assert "process_time" in c["from"]
    if mode == "ddp" and m["config"]["workers"]:
        assert all(e["cpu_time"]["workers_ms_per_step"] > 0 for e in m["epochs"])  # its DataLoader workers
    if mode == "ddp_dali":
        assert all(e["cpu_time"]["workers_ms_per_step"] == 0 for e in m["epochs"])  # DALI forks no worker


@pytest.mark.parametrize("finish", ["alive", "joined"])
def test_the_dataloader_workers_cpu_time_is_the_loaders_whether_they_live_or_were_joined(finish):
    clock = cpu_time.CpuClock()
    loader = DataLoader(Busy(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    batches = iter(loader)
    for _ in range(len(loader)):
        next(batches)
    if finish == "joined":
        assert next(batches, None) is None  # the iterator ends: its workers are joined
        assert not cpu_time.workers()
    rank_s, workers_s, dali_s = clock.read()
    assert workers_s >= 0.1  # 8 items of 20 ms each, less a tick a worker
    assert dali_s == 0.0


def test_a_thread_named_as_dalis_counts_as_the_loader_not_the_rank():
    if not Path("/proc/self/task").is_dir():
        pytest.skip("reads Linux's /proc")
    burned, done = threading.Event(), threading.Event()
    own = []

    def pool_thread():
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text("[DALI][TP0]")
        until = time.thread_time() + 0.2
        while time.thread_time() < until:
            pass
        own.append(time.thread_time())
        burned.set()
        done.wait()

    thread = threading.Thread(target=pool_thread)
    before = time.process_time()  # the whole process: every thread, the burn and whatever else ran
    clock = cpu_time.CpuClock()
    thread.start()
    burned.wait()
    rank_s, workers_s, dali_s = clock.read()
    total = time.process_time() - before
    done.set()
    thread.join()
    tick = 1 / cpu_time.TICK
    assert dali_s == pytest.approx(own[0], abs=2 * tick)  # the burn, as the thread's own clock read it (/proc: ticks)
    # the burn is taken out of the rank's own, once: what the rest of the process spent (on a busy box, its
    # other threads and the /proc scans can take a tenth of a second) stays the rank's
    assert rank_s + dali_s <= total + 1e-6
    assert rank_s <= total - own[0] + 2 * tick
    assert workers_s == 0.0
