"""Across host boundaries: training on a local Slurm cluster (scripts/cluster.sh), submitted
with scripts/slurm/train.sbatch as a user would, and what host faults do to it.

Marker `cluster`: the main suite leaves these out (pytest.ini); scripts/test_cluster.sh runs
them. One cluster (head + 2 nodes) serves the module and is torn down at the end, failed or
not. They skip only where the machine cannot make namespaces; under CI=true that fails.
The fault tests come first: they wait on timeouts with the CPU idle, and the one-host
reference runs, started as the cluster comes up, fill that time (the step is CPU-bound).
"""
import os
import re
import signal
import time

import pytest

from handler.train.checkpoint import load_checkpoint
from tests.cluster_support import OneHost, assert_same_weights, final_weights, up_cluster
from tests.conftest import read_metrics, tail

pytestmark = pytest.mark.cluster
LOST_NODE2 = r"lost rank \d \(node2\)"  # what a surviving rank says about the lost one
DIST_TIMEOUT = 10  # s, for the fault tests
TORCHRUN_AGENTS = ("torch.distributed.run", "handler.runtime.torchrun")  # train.sbatch runs the second
MODES = ["ddp", "ddp_dali", "fsdp", "pp"]


def shown(request):
    """Print a line past pytest's capture (the set-up time belongs in CI's log)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(line):
        with capture.global_and_fixture_disabled():
            print(f"\ncluster set-up: {line}", flush=True)
    return say


def cluster_for_module(tmp_path_factory, request, *, check_nothing_left=False):
    """A cluster of the test module's own, taken down after its last test."""
    made = up_cluster(tmp_path_factory, shown(request))
    try:
        yield made
    finally:
        made.script("down", timeout=120)
        if check_nothing_left:
            assert not made.processes("node1") and not made.processes("node2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from cluster_for_module(tmp_path_factory, request, check_nothing_left=True)


@pytest.fixture(scope="module", autouse=True)
def one_host(cluster, tmp_path_factory):
    """The same training on this one host (mp.spawn, world 2), each mode's run started in the
    background as the cluster comes up; weights(mode) waits for its final weights."""
    references = OneHost(cluster.data, tmp_path_factory, MODES)
    yield references
    references.stop()


def job_failed(job, why: str) -> str:
    return f"{why}; job output:\n{tail(job.output(), 40)}"


def test_a_host_lost_mid_run_ends_the_job_within_a_minute_naming_it(cluster, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp", "--epochs", 6, "--dist-timeout", DIST_TIMEOUT],
                         sbatch=["--no-requeue"], env={"NPROC_PER_NODE": "1"})
    job.wait_for_checkpoint()
    cluster.script("kill", "node2")
    try:
        took = job.finish()
        assert took < 60 and not job.succeeded, job_failed(job, f"ended {job.state} after {took:.0f} s")
        assert re.search(LOST_NODE2, job.output()), job_failed(job, "the lost host is not named")
        cluster.wait_no_job_processes(["node1"], limit=15)
        load_checkpoint(str(tmp_path / "ckpt" / "last.pt"), "cpu")
    finally:
        cluster.script("heal", "node2")  # powers it on again for the tests after this one
        cluster.wait_idle("node2")


def test_a_partitioned_host_ends_the_job_within_the_dist_timeout_and_leaves_nothing_after_heal(cluster, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp", "--epochs", 6, "--dist-timeout", DIST_TIMEOUT],
                         sbatch=["--no-requeue"], env={"NPROC_PER_NODE": "1"})
    job.wait_for(r"^epoch 1/6")
    cluster.script("partition", "node2")
    try:
        took = job.finish()
        assert took <= DIST_TIMEOUT + 30 and not job.succeeded, job_failed(job, f"ended {job.state} after {took:.0f} s")
        assert re.search(LOST_NODE2, job.output()), job_failed(job, "the lost host is not named")
    finally:
        cluster.script("heal", "node2")
    cluster.wait_no_job_processes(["node1", "node2"], limit=60)
    cluster.wait_idle("node2")


# A rank stopped on another host (SIGSTOP: a wedged process, a debugger, a swapped-out host)
# is alive but silent. With --dist-timeout 10 the heartbeat calls it lost after 3.3 s
# (handler/DDP/peers.py silent_after); before, rank 0 said "every peer still answers".
STOPPED_NAMED_S = 15  # s from the stop to the end of the job: 3.3 s silence, srun's --wait=5, slack


def test_a_sigstopped_rank_on_another_host_is_named_with_its_host_and_ends_the_job(cluster, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp", "--epochs", 6, "--dist-timeout", DIST_TIMEOUT],
                         sbatch=["--no-requeue"], env={"NPROC_PER_NODE": "1"})
    job.wait_for(r"steps/epoch")  # the loop (and the heartbeat) has started
    workers = [pid for pid, cmd in cluster.processes("node2").items()
               if "train_cifar.py" in cmd and not any(agent in cmd for agent in TORCHRUN_AGENTS)]
    assert len(workers) == 1, f"not one worker on node2: {cluster.processes('node2')}"
    os.kill(workers[0], signal.SIGSTOP)  # the worker this job started, found in node2's namespaces
    try:
        took = job.finish()
        # Slurm then ends node2's step with SIGCONT and SIGTERM: the woken rank 1 may add its own
        # line (rank 0 is gone), and node2's torchrun says it was stopped; none is a traceback.
        lines = [line for line in job.output().splitlines() if line.startswith("rank 0 (")]
        assert not job.succeeded and took < STOPPED_NAMED_S, job_failed(job, f"ended {job.state} after {took:.0f} s")
        assert len(lines) == 1, job_failed(job, "not one line from rank 0")
        assert lines[0].startswith("rank 0 (node1): lost rank 1 (node2): no heartbeat for 3.33 s"), lines[0]
        assert "every peer still answers" not in job.output() and "Traceback" not in job.output(), \
            job_failed(job, "a wrong line or a traceback")
    finally:
        if workers[0] in cluster.processes("node2"):
            os.kill(workers[0], signal.SIGKILL)
            os.kill(workers[0], signal.SIGCONT)
    cluster.wait_no_job_processes(["node1", "node2"], limit=30)


# A rank alive but stuck on another host: its data loader's worker on node2 is stopped (a read
# hanging on a network filesystem). The rank still beats; it publishes its phase, and rank 0,
# waiting on it for --dist-timeout, names it (handler/DDP/peers.py). Before: "a collective
# failed ... but every peer still answers", and nothing named rank 1 or node2.
STUCK_NAMED_S = DIST_TIMEOUT + 30


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:  # ended since it was listed
        return 0


def test_a_rank_stuck_in_its_data_loader_on_another_host_is_named_with_its_phase(cluster, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp", "--epochs", 6, "--dist-timeout", DIST_TIMEOUT,
                                    "--workers", 1, "--valid-size", 0],
                         sbatch=["--no-requeue"], env={"NPROC_PER_NODE": "1"})
    job.wait_for(r"steps/epoch")
    loaders = []
    while not loaders:  # the rank's loader worker, forked by it (same command line) once its epoch starts
        ranks = {pid for pid, cmd in cluster.processes("node2").items()
                 if "train_cifar.py" in cmd and not any(agent in cmd for agent in TORCHRUN_AGENTS)}
        loaders = [pid for pid in ranks if _parent(pid) in ranks]
        job.wait_for(r"steps/epoch", limit=1)  # the job still runs
        time.sleep(0.2)
    for pid in loaders:
        os.kill(pid, signal.SIGSTOP)
    try:
        took = job.finish()
        said = [line for line in job.output().splitlines() if re.match(r"rank \d+ \(node\d\): ", line)]
        assert not job.succeeded and took < STUCK_NAMED_S, job_failed(job, f"ended {job.state} after {took:.0f} s")
        assert len(said) == 1, job_failed(job, "not one line explaining the stop")
        assert said[0].startswith("rank 0 (node1): rank 1 (node2) is stuck in 'data' at epoch "), said[0]
        assert "(its data loader)" in said[0] and "flight recorder: " in said[0], said[0]
        assert "Traceback" not in job.output(), job_failed(job, "a traceback")
    finally:
        for pid in loaders:
            if pid in cluster.processes("node2"):
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)
    cluster.wait_no_job_processes(["node1", "node2"], limit=30)


def test_workers_lost_on_one_host_restart_elastically_resume_and_complete(cluster, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp", "--epochs", 3],
                         env={"NPROC_PER_NODE": "1", "NNODES": "1:2", "MAX_RESTARTS": "1"})
    job.wait_for_checkpoint()
    workers = [pid for pid, cmd in cluster.processes("node2").items()
               if "train_cifar.py" in cmd and not any(agent in cmd for agent in TORCHRUN_AGENTS)]
    assert workers, f"no worker on node2: {cluster.processes('node2')}"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    job.finish()
    assert job.succeeded, job_failed(job, f"the elastic job ended {job.state} {job.exit_code}")
    assert "elastic restart 1: resuming from" in job.output()
    metrics = read_metrics(tmp_path / "ckpt" / "metrics.json")
    assert [e["epoch"] for e in metrics["epochs"]] == [0, 1, 2] and metrics["test"]["samples"] == 64


def test_a_preempted_job_saves_is_requeued_and_ends_with_the_uninterrupted_weights(cluster, one_host, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp"], env={"NPROC_PER_NODE": "1"})
    job.wait_for(r"^epoch 1/2")  # the signal lands in epoch 2
    cluster.script("run", "scancel", "--batch", "--signal=TERM", job.id)
    job.finish()
    assert not job.succeeded, job_failed(job, "the stopped job reported success")
    assert re.search(r"stopped by SIGTERM at epoch 2, step \d+", job.output()), job_failed(job, "no graceful stop")
    cluster.script("run", "scontrol", "requeue", job.id)
    job.finish()
    assert job.succeeded, job_failed(job, f"the requeued job ended {job.state} {job.exit_code}")
    assert re.search(r"resumed from .*last.pt at epoch 2, step \d+", job.output()), job_failed(job, "no resume")
    assert read_metrics(tmp_path / "ckpt" / "metrics.json")["test"] is not None
    assert_same_weights(final_weights(tmp_path / "ckpt"), one_host.weights("ddp"))


def test_two_hosts_of_two_processes_rendezvous_through_c10d_as_world_four(cluster, tmp_path):
    job = cluster.submit(tmp_path, ["--mode", "ddp", "--epochs", 1], env={"NPROC_PER_NODE": "2"})
    job.finish()
    assert job.succeeded, job_failed(job, f"the job ended {job.state} {job.exit_code}")
    metrics = read_metrics(tmp_path / "ckpt" / "metrics.json")
    hosts = list(metrics["env"]["hosts"].values())
    assert metrics["env"]["world_size"] == 4 and sorted(hosts) == ["node1", "node1", "node2", "node2"]
    assert metrics["test"]["samples"] == 64  # every test image once, over four ranks


@pytest.mark.parametrize("mode", MODES)
def test_two_hosts_train_to_the_same_weights_as_one_host(cluster, one_host, tmp_path, mode):
    job = cluster.submit(tmp_path, ["--mode", mode], env={"NPROC_PER_NODE": "1"})
    job.finish()
    assert job.succeeded, job_failed(job, f"the job ended {job.state} {job.exit_code}")
    env = read_metrics(tmp_path / "ckpt" / "metrics.json")["env"]
    assert sorted(env["hosts"].values()) == ["node1", "node2"] and env["nodes"] == 2
    assert_same_weights(final_weights(tmp_path / "ckpt"), one_host.weights(mode))
