"""The training loop's view of the process group: no-ops when there is none.

Process setup and teardown live in handler/DDP/utils.py; this module only holds the
collectives the shared loop needs.
"""
import os
import socket
from typing import List, Optional

import torch
import torch.distributed as tdist


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in TORCHRUN_ENV)


def torchrun_world() -> Optional[int]:
    """torchrun's WORLD_SIZE, which decides the world under it (docs/MULTINODE.md); None otherwise."""
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else None


def active() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def barrier() -> None:
    if active():
        tdist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if active():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def all_reduce_max_tensor(t: torch.Tensor) -> torch.Tensor:
    """MAX over the ranks of a tensor on the run's device (NCCL on GPU, gloo on CPU)."""
    if active():
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t


def all_reduce_max(value: int) -> int:
    if not active():
        return value
    t = torch.tensor([value], dtype=torch.int64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=cpu_group())
    return int(t.item())


_CPU_GROUP: Optional["tdist.ProcessGroup"] = None  # quoted: torch builds without distributed lack it
_TIMEOUT = None  # the group's --dist-timeout; groups made here wait no longer than it
HOSTS = {}  # rank -> hostname, once hostnames() ran: for naming a lost peer's host


def hostnames() -> dict:
    """{rank: hostname} of every rank; a collective, so every rank calls it at the same point."""
    me = socket.gethostname()
    if not active():
        HOSTS.update({0: me})
        return dict(HOSTS)
    names: List[Optional[str]] = [None] * tdist.get_world_size()
    tdist.all_gather_object(names, me, group=cpu_group())
    HOSTS.update(enumerate(names))
    return dict(HOSTS)


def set_timeout(timeout) -> None:
    """Called with the process group's timeout (a timedelta) before it starts."""
    global _TIMEOUT
    _TIMEOUT = timeout


def cpu_group() -> "tdist.ProcessGroup":
    """A gloo group for small host-side exchanges, also when the main backend is NCCL.
    Created on first use, which every rank reaches at the same point."""
    global _CPU_GROUP
    if _CPU_GROUP is None:
        # Without a timeout, new groups wait torch's default 30 minutes for a silent peer.
        group = tdist.new_group(backend="gloo", timeout=_TIMEOUT)
        assert isinstance(group, tdist.ProcessGroup), "every rank is a member of the group it creates"
        _CPU_GROUP = group
    return _CPU_GROUP


def forget_groups() -> None:
    """Called when the process group is destroyed."""
    global _CPU_GROUP
    _CPU_GROUP = None
    HOSTS.clear()


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Give every rank rank 0's BatchNorm statistics, so evaluation agrees across ranks."""
    if active():
        for buf in module.buffers():
            tdist.broadcast(buf, src=0)
