"""The local Slurm cluster of scripts/cluster.sh, as tests/tools/test_cluster.py uses it: one
cluster per module, jobs submitted with scripts/slurm/train.sbatch, the processes of a node
found through its namespaces, and final weights read from any mode's checkpoint."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from handler.data.synthetic import write_synthetic
from tests.conftest import ROOT, SLACK, hung, run_process, tail

SCRIPT = ROOT / "scripts" / "cluster.sh"
SBATCH = ROOT / "scripts" / "slurm" / "train.sbatch"
N_TRAIN, N_TEST = 512, 64
# 2 epochs of 14 steps: long enough for a signal to land mid-run, short enough for CI.
TRAIN = ["--dataset", "synthetic", "--synthetic-train", N_TRAIN, "--synthetic-test", N_TEST,
         "--model", "resnet20", "--workers", 0, "--no-progress", "--epochs", 2, "--batch-size", 32,
         "--valid-size", 64, "--lr", 0.05]
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
COMPLETING_S = 10  # s: longer than a healthy job's clean-up, far shorter than SlurmdTimeout
JOB_S = 90  # s: the longest job of TRAIN on 2 busy cores, measured; past SLACK times it, it hung


class Job:
    """train.sbatch submitted with sbatch: its id, its output, and how it ended."""

    def __init__(self, cluster, folder: Path, args, sbatch=(), env=None):
        self.cluster, self.folder, self.out = cluster, folder, folder / "out.txt"
        self.state = self.exit_code = None
        submitted = run_process([SCRIPT, "run", "sbatch", "--parsable", f"--output={self.out}", *sbatch,
                                 SBATCH, *args], timeout=60,
                                env={**cluster.env, "CKPT": str(folder / "ckpt"), **(env or {})})
        assert submitted.returncode == 0, f"sbatch failed: {submitted.stdout}{submitted.stderr}"
        self.id = int(submitted.stdout.strip().split(";")[0])

    def output(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def wait_for(self, pattern: str, limit: float = JOB_S) -> None:
        """Until the job's output matches `pattern` (a regex)."""
        deadline = time.time() + SLACK * limit
        while not re.search(pattern, self.output(), re.M):
            assert self.cluster.job_state(self.id)[0] not in FINISHED, \
                f"the job ended before /{pattern}/:\n{tail(self.output(), 40)}"
            if time.time() > deadline:
                self.cluster.script("run", "scancel", self.id)
                hung(["job", self.id], SLACK * limit, self.output(), f"(waiting for /{pattern}/)")
            time.sleep(0.5)

    def wait_for_checkpoint(self, limit: float = JOB_S) -> None:
        """Until the first last.pt is written (the epoch's line is printed before it)."""
        self.wait_for(r"^epoch 1/", limit)
        deadline = time.time() + SLACK * limit
        while not (self.folder / "ckpt" / "last.pt").exists():
            if time.time() > deadline:
                hung(["job", self.id], SLACK * limit, self.output(), "(waiting for last.pt)")
            time.sleep(0.2)

    def finish(self, limit: float = JOB_S) -> float:
        """Seconds until the job ended as `sbatch --wait` sees it (its batch script exited); sets
        `state` (COMPLETED, FAILED, ..., or COMPLETING while Slurm still cleans up on a node it
        cannot reach) and `exit_code` ("N:S")."""
        start = time.time()
        self.state, self.exit_code, ended = self.cluster.wait_done(self.id, limit)
        return ended - start

    @property
    def succeeded(self) -> bool:
        return (self.state, self.exit_code) == ("COMPLETED", "0:0")


class Cluster:
    def __init__(self, state: Path, data: Path):
        self.state, self.data = state, data
        self.env = {"CLUSTER_STATE": str(state), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}

    def script(self, *args, timeout=60) -> subprocess.CompletedProcess:
        proc = run_process([SCRIPT, *args], timeout=timeout, env=self.env)
        assert proc.returncode == 0, f"cluster.sh {' '.join(map(str, args))}: {proc.stdout}{proc.stderr}"
        return proc

    def submit(self, folder: Path, args, sbatch=(), env=None) -> Job:
        folder.mkdir(parents=True, exist_ok=True)
        return Job(self, folder, ["--data", self.data, *TRAIN, *args], sbatch, env)

    def job_state(self, job_id: int) -> tuple:
        """(JobState, ExitCode) of a job Slurm still shows (MinJobAge keeps a finished one for 5 s)."""
        shown = self.script("run", "scontrol", "-o", "show", "job", job_id).stdout
        return re.search(r"JobState=(\S+)", shown).group(1), re.search(r"ExitCode=(\S+)", shown).group(1)

    def wait_done(self, job_id: int, limit: float = JOB_S) -> tuple:
        """(JobState, ExitCode, when it ended) once the job has ended, polled faster than Slurm
        forgets it. A job ends when its batch script exits (`sbatch --wait` returns then): Slurm
        shows it COMPLETING, which passes in a moment, except on a node that is gone, where it
        lasts until Slurm marks the node DOWN (SlurmdTimeout). Then COMPLETING is the answer."""
        deadline, ended = time.time() + SLACK * limit, None
        while time.time() < deadline:
            state = self.job_state(job_id)
            if state[0] in FINISHED:
                return (*state, ended or time.time())
            if state[0] == "COMPLETING":
                ended = ended or time.time()
                if state[1] != "0:0" or time.time() - ended > COMPLETING_S:
                    return (*state, ended)  # a failed job is over; only a success waits for its state
            time.sleep(0.5)
        self.script("run", "scancel", job_id)
        hung(["job", job_id], SLACK * limit, self.script("status").stdout)

    def node_state(self, node: str) -> str:
        return self.script("run", "sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.strip()

    def wait_idle(self, node: str, limit: float = 60) -> None:
        deadline = time.time() + SLACK * limit
        while self.node_state(node) != "idle":
            if time.time() > deadline:
                hung(["sinfo", node], SLACK * limit, self.script("status").stdout)
            time.sleep(0.5)

    def processes(self, node: str) -> dict:
        """pid -> command line of every process on `node` but its holder and slurmd (none when it is off)."""
        record = self.state / "run" / f"holder-{node}.pid"
        if not record.exists():
            return {}
        holder, _, net, mnt = record.read_text().split()
        daemon = self.state / "run" / f"slurmd-{node}.pid"
        skip = {holder, daemon.read_text().split()[0] if daemon.exists() else ""}
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if (pid not in skip and os.readlink(f"/proc/{pid}/ns/net") == net
                        and os.readlink(f"/proc/{pid}/ns/mnt") == mnt):
                    found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
        return found

    def wait_no_job_processes(self, nodes, limit: float = 30) -> None:
        deadline = time.time() + limit
        while any(self.processes(n) for n in nodes):
            if time.time() > deadline:
                left = {n: self.processes(n) for n in nodes}
                pytest.fail(f"processes of the job left after {limit:.0f} s: {left}", pytrace=False)
            time.sleep(0.5)


class OneHost:
    """Reference runs on this host with mp.spawn (world 2), one per mode, run one after another
    in the background from the moment the cluster is up. The fault tests come first and leave
    the CPU idle while they wait on timeouts; these runs fill that time."""

    def __init__(self, data: Path, tmp_path_factory, modes):
        self.data, self.tmp = data, tmp_path_factory
        self.done = {mode: threading.Event() for mode in modes}
        self.results, self.cache, self.running, self.stopped = {}, {}, None, False
        self.lock = threading.Lock()  # stop() and the start of a run
        threading.Thread(target=self._run_all, args=(list(modes),), name="one-host", daemon=True).start()

    def _run_all(self, modes) -> None:
        for mode in modes:
            folder = self.tmp.mktemp(f"one_host_{mode}")
            command = [sys.executable, ROOT / "train_cifar.py", "--mode", mode, "--num_gpu", 2, "--ckpt", folder,
                       "--data", self.data, *TRAIN]
            with self.lock:
                if self.stopped:
                    return
                self.running = proc = subprocess.Popen(
                    list(map(str, command)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
            try:
                out, err = proc.communicate(timeout=SLACK * JOB_S)
                self.results[mode] = (proc.returncode, out, err, folder)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                self.results[mode] = (None, *proc.communicate(), folder)
            self.done[mode].set()

    def weights(self, mode: str) -> dict:
        if mode not in self.cache:
            limit = SLACK * JOB_S * len(self.done)  # every run before this one, at its longest
            if not self.done[mode].wait(limit):
                hung(["one-host run", mode], limit)
            code, out, err, folder = self.results[mode]
            if code is None:
                hung(["one-host run", mode], SLACK * JOB_S, out, err)
            assert code == 0, tail(err, 30)
            with open(folder / "metrics.json") as f:
                assert json.load(f)["env"]["nodes"] == 1
            self.cache[mode] = final_weights(folder)
        return self.cache[mode]

    def stop(self) -> None:
        """End a run still going (the module ended early); the ones not started never start."""
        with self.lock:
            self.stopped = True
            if self.running is not None and self.running.poll() is None:
                os.killpg(self.running.pid, 9)


def require_cluster_machine() -> None:
    """A skip (a failure under CI=true) naming what this machine lacks for a local cluster."""
    check = run_process([SCRIPT, "check"], timeout=30)
    if check.returncode != 0:
        why = f"no local cluster on this machine: {check.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI must run the cluster tests", pytrace=False)
        pytest.skip(why)


def up_cluster(tmp_path_factory, report) -> Cluster:
    """A running head + 2 nodes, or a skip (a failure under CI=true) naming what the machine lacks."""
    require_cluster_machine()
    data = tmp_path_factory.mktemp("cluster_data")
    write_synthetic(str(data / f"synthetic_{N_TRAIN}x{N_TEST}"), N_TRAIN, N_TEST)
    cluster = Cluster(tmp_path_factory.mktemp("cluster_state"), data)
    up = cluster.script("up", "--nodes", "2", timeout=600)  # the first use installs Slurm
    report(next(line for line in up.stdout.splitlines() if " up in " in line))
    return cluster


def final_weights(ckpt: Path) -> dict:
    """The model's state_dict in a last.pt of any mode (fsdp's shard folder is gathered)."""
    saved = torch.load(ckpt / "last.pt", map_location="cpu", weights_only=True)
    if "shards" not in saved:
        return saved["model"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    whole = ckpt / "gathered.pt"
    dcp_to_torch_save(ckpt / saved["shards"], whole)
    return torch.load(whole, map_location="cpu", weights_only=True)["model"]


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        diff = (a[name].double() - b[name].double()).abs().max().item() if a[name].numel() else 0.0
        assert diff <= atol, f"{name} differs by {diff:.3g}"
