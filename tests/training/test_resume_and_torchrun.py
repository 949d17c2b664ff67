"""Resumed runs equal straight runs; torchrun on two nodes trains too. (torchrun on one node
with 2 processes: tests/faults/test_faults.py's elastic-restart run trains to the end under it.)"""
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import (free_port, N_TEST, ROOT, SLACK, SMALL, hung, kill_group, read_metrics, run_cli,
                            two_epoch_args)

ONE_EPOCH = ["--epochs", 1, "--batch-size", 64, "--valid-size", 100, *SMALL]


@pytest.mark.slow  # two runs of their own beside the shared straight one: CI's slow step (pytest.ini)
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_epochs_straight_equal_one_epoch_then_resume_bit_for_bit(mode, two_epoch_run, data_root, tmp_path):
    _, straight = two_epoch_run(mode)  # the run test_training_modes checks
    split = tmp_path / "split"
    args = ["--data", data_root, *two_epoch_args(mode, split)]
    for extra, budget in ((["--stop-after", 1], 35), (["--resume"], 35)):
        proc = run_cli([*args, *extra], budget=budget)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = torch.load(straight / "last.pt", weights_only=True), torch.load(split / "last.pt", weights_only=True)
    if mode == "ddp":
        assert a["model"].keys() == b["model"].keys()
        for name in a["model"]:
            assert torch.equal(a["model"][name], b["model"][name]), f"{name} differs after resume"
    else:  # sharded: every rank wrote its own shard folder, and only the newest is kept
        assert sorted(p.name for p in split.glob("shards-*")) == [b["shards"]]
    ma, mb = read_metrics(straight / "metrics.json"), read_metrics(split / "metrics.json")
    assert [e["train_loss"] for e in ma["epochs"]] == [e["train_loss"] for e in mb["epochs"]]
    assert ma["test"] == mb["test"]



TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.slow  # two torchrun launchers for one check: CI's slow step (pytest.ini)
def test_torchrun_two_nodes_on_loopback_train_together(data_root, tmp_path):
    port = free_port()
    nodes = []
    for node_rank in (0, 1):
        cmd = [*TORCHRUN, "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node_rank}",
               "--master_addr=127.0.0.1", f"--master_port={port}", str(ROOT / "train_cifar.py"),
               "--mode", "ddp", "--data", str(data_root), "--ckpt", str(tmp_path / f"node{node_rank}"),
               *map(str, ONE_EPOCH)]
        # Both "nodes" share this machine's cores: one thread each, as on a real split.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        nodes.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    limit = SLACK * 25  # s, measured for both nodes together
    try:
        outputs = [p.communicate(timeout=limit) for p in nodes]
    except subprocess.TimeoutExpired:
        for p in nodes:
            kill_group(p)
        hung(nodes[0].args, limit, *nodes[0].communicate())
    finally:
        for p in nodes:
            kill_group(p)
    for p, (_, err) in zip(nodes, outputs):
        assert p.returncode == 0, err[-3000:]
    m = read_metrics(tmp_path / "node0" / "metrics.json")
    assert m["env"]["world_size"] == 2
    assert m["test"]["samples"] == N_TEST
    assert not (tmp_path / "node1" / "metrics.json").exists(), "only global rank 0 writes metrics"
