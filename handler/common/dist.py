"""The training loop's view of the process group: no-ops when there is none.

Process setup and teardown live in handler/DDP/utils.py; this module only holds the
collectives the shared loop needs.
"""
import torch
import torch.distributed as tdist


def active() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def barrier() -> None:
    if active():
        tdist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if active():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Give every rank rank 0's BatchNorm statistics, so evaluation agrees across ranks."""
    if active():
        for buf in module.buffers():
            tdist.broadcast(buf, src=0)
