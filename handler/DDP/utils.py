"""The lab's Problems 1-3, and the rank processes' life for every DDP-family mode (ddp,
ddp_dali, fsdp, pp): `run_process` starts them, `initialize_group` joins them into one process
group, `destroy_process` takes the group down. The one place that knows how.

Called the lab's way they do what the lab means (the course kit's main_func(proc_id, args) in
args.num_gpu processes; tests/lab/test_lab_kit.py drives them so); the harness adds its
extras (a held store, timeouts, CPU ranks over gloo) as keyword arguments.

Single node: `run_process` starts one process per device (see `start_method`) around the
rendezvous store that `held_store` keeps in the spawning process. Under torchrun (RANK,
WORLD_SIZE, LOCAL_RANK set) the processes already exist and `initialize_group` joins them
through the environment instead. Who calls what: handler/DDP/__init__.py.
"""
import contextlib
import datetime
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Iterator, List, Optional, Tuple, cast

import torch
import torch.distributed as tdist
# Before any group exists: torch.distributed.nn binds `group.WORLD` as a default argument when
# first imported, and DDP's set-up imports it. Imported after init_process_group, it would hold
# that group for the life of the process, past destroy_process_group, so its gloo threads and
# rank 0's store server ran into the interpreter's own teardown (an intermittent SIGABRT at exit).
import torch.distributed.nn  # noqa: F401
from torch.multiprocessing.spawn import ProcessExitedException, start_processes  # the package re-exports them privately

from ..runtime import dist
from ..runtime.dist import launched_by_torchrun
from ..runtime.devices import cuda_status
from ..runtime.errors import UserError
from ..runtime.machine import START_BOUND_S, slow_start_warning
from ..runtime.nvtx import profiler_attached
from .leftovers import end_job, helpers, started_at, stat
from .peers import silent_after

# NCCL's watchdog tears its rank down (SIGABRT) when a collective passes the group's timeout.
# It waits this much longer than --dist-timeout, so the heartbeat (peers.py, a third of
# --dist-timeout) names the silent peer first.
NCCL_MARGIN_S = 30.0
GRACE_S = 5  # after a rank fails, how long the others get to exit before SIGTERM/SIGKILL
# What the fork server imports once for every rank: torch, and torch._dynamo, which DDP's
# constructor and every optimizer step import (1.1 s).
PRELOAD = ["torch", "torch._dynamo", "torch.distributed.nn"]


@dataclass(frozen=True)
class Rank:
    rank: int
    local_rank: int
    world_size: int
    device: str
    backend: str


def start_method(use_cuda: bool) -> str:
    """forkserver for CPU ranks: a server process imports torch once and forks each rank from
    it. With spawn every rank imports it again: 2.6 s of CPU a rank, most of a short run's cost
    on a small CPU box. spawn for GPU ranks (a rank must never inherit a process that touched
    the CUDA driver, and the saving is small beside GPU work) and under a profiler: nsys follows
    a rank only through exec (a forked one needs --trace-fork-before-exec, which its manual says
    may crash or deadlock the program)."""
    return "spawn" if use_cuda or profiler_attached() else "forkserver"


def run_process(func, args, nprocs: Optional[int] = None, *, use_cuda: Optional[bool] = None) -> None:
    """Problem 1: run func(proc_id, args) in args.num_gpu fresh processes (proc_id 0..N-1), as
    torch.multiprocessing.spawn does, and wait for them.

    nprocs: a count other than args.num_gpu (the harness passes its world size).
    use_cuda: whether the ranks will use GPUs (default: whether CUDA sees one); it picks how
    they start (`start_method`).
    The first SIGINT/SIGTERM is passed on to the ranks, which stop together at a step
    boundary and save; a second one kills them. When one rank dies the others are
    stopped within seconds and the dead rank is named. Once it returns or raises, no process
    the job started runs any more (leftovers.py).
    """
    nprocs = args.num_gpu if nprocs is None else nprocs
    use_cuda = cuda_status()[0] > 0 if use_cuda is None else use_cuda
    method = start_method(use_cuda)
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(PRELOAD)
    before = helpers()
    ctx = start_processes(func, args=(args,), nprocs=nprocs, join=False, start_method=method)
    assert ctx is not None, "join=False returns the processes' context"
    processes = cast(List[BaseProcess], ctx.processes)  # torch fills a list made as [None] * n
    ranks = {proc.pid: started_at(proc.pid) for proc in processes if proc.pid is not None}
    signals_seen = []

    def forward(signum, frame):
        signals_seen.append(signum)
        for proc in processes:
            if proc.is_alive() and proc.pid is not None:  # None only before start()
                os.kill(proc.pid, signal.SIGTERM if len(signals_seen) == 1 else signal.SIGKILL)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    killed: List[Tuple[int, str]] = []
    try:
        while not _join(ctx, killed):
            pass
    except ProcessExitedException as err:
        if killed and not signals_seen:
            # The cause, whichever rank torch's join reports: a peer that then lost it may have
            # exited (code 2, naming it lost) in the same instant.
            raise UserError(f"rank {killed[0][0]} was killed by {killed[0][1]}; the other ranks were stopped") from None
        # 2: the rank printed its one-line reason. 128+n: it stopped on signal n and said so.
        if err.exit_code == 2 or (err.exit_code or 0) > 128:
            raise SystemExit(err.exit_code) from None
        if signals_seen and err.signal_name:
            print(f"stopped by {signal.Signals(signals_seen[0]).name} before rank {err.error_index} "
                  "could save; the last checkpoint is unchanged", file=sys.stderr, flush=True)
            raise SystemExit(128 + signals_seen[0]) from None
        how = f"was killed by {err.signal_name}" if err.signal_name else f"exited with code {err.exit_code}"
        raise UserError(f"rank {err.error_index} {how}; the other ranks were stopped") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        end_job(ranks, before)  # what the job started beside its ranks ends with it


def _join(ctx, killed: List[Tuple[int, str]]) -> bool:
    """ctx.join, once some rank has ended. Ranks that a signal killed before anything here or
    in torch stopped a rank are added to `killed` (index, signal name). When one failed, a rank
    that is stopped (SIGSTOP, a debugger) is killed at once: it can never stop by itself, and
    torch would give it two grace periods and two warnings before killing it."""
    running = [p.sentinel for p in ctx.processes if p.exitcode is None]
    if running:  # none: the rest ended since the last join, which takes them now (wait([]) never returns)
        multiprocessing.connection.wait(running)
    if not killed:
        killed += [(i, signal.Signals(-p.exitcode).name) for i, p in enumerate(ctx.processes)
                   if p.exitcode is not None and p.exitcode < 0]
    if any(p.exitcode not in (None, 0) for p in ctx.processes):
        for proc in ctx.processes:
            if proc.exitcode is None and _stopped(proc.pid):
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
    return ctx.join(timeout=0, grace_period=GRACE_S)


def _stopped(pid: int) -> bool:
    return stat(pid)[:1] in (["T"], ["t"])


@contextlib.contextmanager
def held_store(host: str, port: int) -> Iterator[int]:
    """Host the ranks' rendezvous store in the process that spawns them, and yield its port.

    The store binds the port itself (0: the kernel picks a free one) and keeps it until the
    ranks are done. Choosing a free port and letting rank 0 bind it later would leave seconds
    in which another program can take it (EADDRINUSE at start-up)."""
    try:
        store = tdist.TCPStore(host, port, is_master=True, wait_for_workers=False)  # pyright: ignore[reportPrivateImportUsage]  # public API; torch.distributed re-exports it without __all__
    except (RuntimeError, OSError) as err:  # DistNetworkError is a RuntimeError
        reason = re.search(r"message: ([^\n]+)", str(err))  # c10d: "..., name: EADDRINUSE, message: address already in use"
        raise UserError(f"--port {port} on {host} is not available ({reason[1] if reason else str(err)[:80]}); "
                        "choose another port, or omit --port to pick a free one") from None
    try:
        yield store.port
    finally:
        del store


def initialize_group(proc_id: int, host: str, port, num_gpu: int, *, use_cuda: Optional[bool] = None,
                     timeout_s: float = 120.0, store_held: bool = False, start_bound_s: float = START_BOUND_S) -> Rank:
    """Problem 2: make process `proc_id` rank proc_id of a num_gpu-process group that meets at
    tcp://host:port, on GPU proc_id (torch.cuda.set_device), and wait for every peer.

    use_cuda: False puts the ranks on CPU over gloo (default: whether CUDA sees a GPU).
    timeout_s: how long a collective waits for a missing peer.
    store_held: the spawning process hosts the store at host:port (`held_store`), so every
    rank joins it as a client; otherwise rank 0 creates it (tcp:// rendezvous, the lab's way).
    start_bound_s: a group not formed by then gets a warning naming NCCL_P2P_DISABLE=1.
    Under torchrun its environment places the rank, and proc_id and num_gpu are ignored."""
    use_cuda = cuda_status()[0] > 0 if use_cuda is None else use_cuda
    port, world_size = int(port), num_gpu
    cuda_status()  # probe CUDA once, quietly: the group's barrier asks again
    if launched_by_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        init_method = "env://"
    else:
        rank, world, local_rank, local_world = proc_id, world_size, proc_id, world_size
        init_method = f"tcp://{host}:{port}"
    if use_cuda:
        check_local_rank(local_rank)
        torch.cuda.set_device(local_rank)  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[ddp]
        device, backend = f"cuda:{local_rank}", "nccl"  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[ddp]
    else:
        # Ranks on one machine share its cores; more threads than cores only thrash.
        # An explicit OMP_NUM_THREADS (torchrun sets one) wins.
        threads = os.environ.get("OMP_NUM_THREADS") or (os.cpu_count() or 1) // local_world
        torch.set_num_threads(max(1, int(threads)))
        device, backend = "cpu", "gloo"
    dist.set_timeout(datetime.timedelta(seconds=timeout_s))
    timeout = datetime.timedelta(seconds=group_timeout_s(backend, timeout_s))
    device_id = torch.device(device) if use_cuda else None
    with slow_start_warning(start_bound_s):
        if store_held and not launched_by_torchrun():
            # The keys under the same prefix as a tcp:// rendezvous would use.
            client = tdist.TCPStore(host, port, world, is_master=False, timeout=timeout)  # pyright: ignore[reportPrivateImportUsage]  # as in held_store
            tdist.init_process_group(backend, store=tdist.PrefixStore("default_pg", client), rank=rank,  # pyright: ignore[reportPrivateImportUsage]  # as in held_store
                                     world_size=world, timeout=timeout, device_id=device_id)
        else:
            tdist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                     timeout=timeout, device_id=device_id)
        tdist.barrier()
    return Rank(rank=rank, local_rank=local_rank, world_size=world, device=device, backend=backend)


def group_timeout_s(backend: str, timeout_s: float) -> float:
    """The main group's collective timeout: --dist-timeout for gloo (a timed-out collective is
    turned into one line by peers.watch), more for NCCL, whose watchdog would otherwise abort
    the rank before the heartbeat names the silent peer."""
    return max(timeout_s, silent_after(timeout_s)) + NCCL_MARGIN_S if backend == "nccl" else timeout_s


def check_local_rank(local_rank: int) -> None:
    """torchrun may start more processes on a node than it has GPUs: say so in one line
    instead of set_device's "invalid device ordinal" traceback."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UserError(f"LOCAL_RANK {local_rank} but only {count} GPU(s) are visible on this node; "
                        f"start at most {count} processes per node (torchrun --nproc_per_node {count}) "
                        "or set CUDA_VISIBLE_DEVICES")


def store_address(cfg) -> Tuple[str, int]:
    """Where the group's rendezvous store listens: torchrun's MASTER_ADDR:MASTER_PORT, else --host/--port."""
    if launched_by_torchrun():
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return cfg.host, cfg.port


def elastic_restart_count() -> int:
    """How often torchrun has restarted this job's workers (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) if launched_by_torchrun() else 0


def destroy_process(*, abort: bool = False) -> None:
    """Problem 3: leave the process group (destroy_process_group), after forgetting what
    handler/runtime/dist.py keeps about it; safe when none was joined. abort: after a failure, drop the group's pending work instead
    of draining it: NCCL's shutdown waits for queued collectives, and one a lost peer never
    joined would hold this rank until the launcher kills it. gloo's shutdown waits for no peer
    (and torch before 2.7 cannot abort a gloo group), so gloo drains."""
    dist.forget_groups()
    if not tdist.is_initialized():
        return
    if abort and tdist.get_backend() == "nccl":
        tdist.distributed_c10d._abort_process_group()  # gpu-only: tests/machine/test_gpu_faults.py::test_sigstopped_rank_is_named_on_nccl
    else:
        tdist.destroy_process_group()
