"""Shared fixtures: small datasets in the real CIFAR layout, running the CLI within a
measured budget, shared training runs, and which tests may see GPUs.

scripts/test.sh runs the suite on two pytest-xdist workers; plain `pytest` runs it in one
process, and every test passes both ways. Each worker builds its own session and module
fixtures, so (tests/parallel.py):
- tests that use one module-scoped fixture run on one worker (an automatic group): the
  fixture is built once;
- an expensive session run is shared through a folder all workers see (shared_tmp), under
  a file lock, as two_epoch_run does: whichever worker needs it first trains it, once;
- tests that must run on one worker together name a group: @pytest.mark.xdist_group("name");
- the slowest files are handed out first (SLOW_FIRST there): a new file of slow tests joins it;
- what must not run beside its like takes turns: with one_at_a_time("nsys"), as nsys runs do.
"""
import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Threads that wait for work sleep instead of spinning, here and in every process a test starts
# (set before torch loads OpenMP). The suite runs trainings side by side on 2 cores, and spinning
# threads of one run steal the cores the other needs: two 2-thread dp runs at once took 127 s
# each with the default policy and 12.6 s with PASSIVE (2026-11-23, same losses to the digit).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from handler.runtime.devices import cuda_status  # noqa: E402
from handler.data.synthetic import write_synthetic  # noqa: E402
from tests.parallel import (assign_groups, locked, one_at_a_time, pytest_collection_finish,  # noqa: E402,F401
                            pytest_configure, pytest_configure_node, pytest_unconfigure, pytest_xdist_make_scheduler,
                            slow_first)

# A small synthetic set: learnable in 2 epochs of resnet20, sizes deliberately not
# divisible by the world sizes and batch sizes the tests use.
N_TRAIN, N_TEST = 1201, 301
SMALL = ["--dataset", "synthetic", "--synthetic-train", str(N_TRAIN), "--synthetic-test", str(N_TEST),
         "--model", "resnet20", "--workers", "0", "--no-progress"]

# ---- GPU visibility -------------------------------------------------------------------
# CPU tests run as on a machine without GPUs: CUDA_VISIBLE_DEVICES= for every process
# they start and, in this process, torch reports none. Tests marked `gpu` (or `gpus(n)`)
# see the GPUs pytest was started with; `gpus(n)` skips with a reason below n GPUs.
_STARTED_WITH = os.environ.get("CUDA_VISIBLE_DEVICES")


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """GPUs visible to this session's gpu tests; asked once, before any test hides them."""
    return cuda_status()[0]


def gpus_needed(item) -> int:
    many = item.get_closest_marker("gpus")
    if many is not None:
        return int(many.args[0])
    return 1 if item.get_closest_marker("gpu") is not None else 0


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    count = gpu_count()
    for item in items:
        needed = gpus_needed(item)
        if needed > count:
            why = (f"needs {needed} GPUs, {count} visible" if count
                   else f"needs CUDA: {cuda_status()[1] or 'no GPU visible'}")
            item.add_marker(pytest.mark.skip(reason=why))
    assign_groups(items)
    if hasattr(config, "workerinput"):  # an xdist worker
        slow_first(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before any fixture: a session fixture first built by a CPU test trains on the CPU too.
    show = gpus_needed(item) > 0
    if show and _STARTED_WITH is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = _STARTED_WITH
    elif show:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if gpu_count():  # CUDA is initialised in this process: only torch's answers can hide it
        _torch_sees_gpus(show)


def _torch_sees_gpus(show: bool) -> None:
    import torch
    from handler.runtime import devices
    real = _torch_sees_gpus.__dict__.setdefault("real", (torch.cuda.is_available, torch.cuda.device_count))
    torch.cuda.is_available, torch.cuda.device_count = real if show else (lambda: False, lambda: 0)
    devices.cuda_status.cache_clear()


# ---- running processes within a measured budget ------------------------------------------
# A budget is the seconds a command took on the slow configuration: 2 cores shared with
# other jobs (load ~6, as on a busy CI runner or this lab's shared machine) and
# ONEDNN_MAX_CPU_ISA=AVX2. Past SLACK times its budget it counts as hung: it is killed
# with everything it started, and the test fails naming the command and its last lines.
# TEST_BUDGET_SCALE stretches every budget on a slower machine.
SLACK = 3 * float(os.environ.get("TEST_BUDGET_SCALE", "1"))
TAIL_LINES = 20


def tail(text, lines=TAIL_LINES) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def hung(cmd, seconds, out="", err="") -> None:
    """Fail the test: `cmd` ran past `seconds`; show the last lines it printed."""
    shown = " ".join(map(str, cmd))
    pytest.fail(f"timed out after {seconds:.0f} s: {shown}\n--- last stdout lines ---\n{tail(out)}"
                f"\n--- last stderr lines ---\n{tail(err)}", pytrace=False)


def run_process(cmd, *, budget=None, timeout=None, cwd=ROOT, env=None, inherit=True) -> subprocess.CompletedProcess:
    """Run cmd (its own process group) to the end and capture its output. `budget`: the
    measured seconds (the timeout is SLACK times it); `timeout`: seconds, for old callers.
    `env` adds to this process's environment, or replaces it with inherit=False."""
    limit = SLACK * budget if budget is not None else (timeout or 240)
    full_env = {**(os.environ if inherit else {}), "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [str(c) for c in cmd]
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        out = None
    except BaseException:  # Ctrl-C or a failure here: leave no training behind
        kill_group(proc)
        raise
    if out is None:
        kill_group(proc)
        hung(cmd, limit, *proc.communicate())
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def spawn_within_budget(fn, args, nprocs, *, budget, name) -> None:
    """mp.spawn fn(rank, *args) on nprocs processes and wait; past SLACK x budget seconds kill
    them and fail the test naming `name`."""
    import torch.multiprocessing as mp
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, start_method="spawn", join=False)
    deadline = time.time() + SLACK * budget
    while not ctx.join(timeout=1):
        if time.time() > deadline:
            for process in ctx.processes:
                process.kill()
            hung(["spawn", name, f"x{nprocs}"], SLACK * budget)


def kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_cli(args, *, budget=None, timeout=None, cwd=ROOT, env=None, cmd=None):
    """Run train_cifar.py (or cmd) with args in a fresh process; see run_process."""
    command = cmd or [sys.executable, str(ROOT / "train_cifar.py")]
    return run_process([*command, *args], budget=budget, timeout=timeout, cwd=cwd, env=env)


def error_lines(proc) -> list:
    """stderr lines that are not the machine's CUDA note."""
    return [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("note:")]


def read_metrics(path) -> dict:
    with open(path) as f:
        return json.load(f)


def free_port() -> int:
    """A port for a rendezvous that several processes must know in advance (tests that can
    pass port 0 do). A port-0 bind would do here only until the test's processes bind it:
    meanwhile another xdist worker's gloo ranks, stores and connections take ports from the
    same kernel range (EADDRINUSE, seen in CI). So: below that range, in a block of its own
    for each xdist worker, and free now."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
    block = (ephemeral_low - 20000) // 8
    first = 20000 + (worker % 8) * block
    for port in random.sample(range(first, first + block), 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + block - 1}")


# ---- data and shared runs --------------------------------------------------------------
def shared_tmp(tmp_path_factory) -> Path:
    """A folder that every xdist worker of this session sees (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture
def nsys_turn():
    """For a test whose product code runs nsys itself (gpu_check's probe of nsys): it takes its
    turn with the other nsys runs (tests/parallel.py: sessions that start together can fail)."""
    with one_at_a_time("nsys"):
        yield


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A --data folder whose synthetic dataset is already generated."""
    root = tmp_path_factory.mktemp("data")
    write_synthetic(str(root / f"synthetic_{N_TRAIN}x{N_TEST}"), N_TRAIN, N_TEST)
    return root


# Two epochs that learn: what the mode tests check, what resume must reproduce exactly,
# and the checkpoints the fault tests resume from.
TWO_EPOCHS = ["--epochs", 2, "--batch-size", 64, "--valid-size", 100, "--lr", 0.05, *SMALL]
PROCESSES = {"dp": 1, "ddp": 2, "ddp_dali": 2, "fsdp": 2}
TWO_EPOCH_BUDGET = {"dp": 30, "ddp": 35, "ddp_dali": 40, "fsdp": 40}  # s, measured (see SLACK)


def two_epoch_args(mode, folder) -> list:
    return ["--mode", mode, "--num_gpu", PROCESSES[mode], "--ckpt", folder, *TWO_EPOCHS]


@pytest.fixture(scope="session")
def two_epoch_run(data_root, tmp_path_factory):
    """run(mode) -> (CompletedProcess, folder): one finished two-epoch run per mode, trained
    once per session (by whichever xdist worker asks first) and shared by the tests that
    only read it. Never write into it."""
    runs = {}

    def run(mode):
        if mode not in runs:
            folder = shared_tmp(tmp_path_factory) / f"{mode}_two_epochs"
            record = folder.with_name(folder.name + ".json")
            with locked(folder.with_name(folder.name + ".lock")):
                if not record.exists():  # a run that hung is not tried again by the next test
                    outcome = {"args": [], "returncode": -1, "stdout": "",
                               "stderr": f"the {mode} two-epoch run did not finish: see the test that started it"}
                    try:
                        proc = run_cli(["--data", data_root, *two_epoch_args(mode, folder)],
                                       budget=TWO_EPOCH_BUDGET[mode])
                        outcome = {"args": proc.args, "returncode": proc.returncode,
                                   "stdout": proc.stdout, "stderr": proc.stderr}
                    finally:
                        record.write_text(json.dumps(outcome))
                proc = subprocess.CompletedProcess(**json.loads(record.read_text()))
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[mode] = proc, folder
        return runs[mode]
    return run
