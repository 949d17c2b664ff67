"""The lab's Problem 4, wrapping a model for DDP: the only place the DDP modes touch the model."""
import inspect
from typing import Optional

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel

from .comm_hook import CommHook

# torch's SyncBatchNorm forward drops ranks with no samples by a boolean mask
# (torch/nn/modules/_functions.py, `count_all[mask]`): a result whose size depends on the
# data, so the host waits for the device at every BatchNorm layer of every step.
SYNC_BN_NOTE = ("--sync-bn: torch's SyncBatchNorm syncs the host with the GPU once per BatchNorm "
                "layer per step (it indexes with a boolean mask); drop --sync-bn for a step without them")


def no_buffer_sync(ddp_class=DistributedDataParallel) -> dict:
    """torch 2.13 renamed broadcast_buffers to forward_sync_buffers; 2.6-2.12 know only the old name."""
    if "forward_sync_buffers" in inspect.signature(ddp_class).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def model_to_DDP(model: torch.nn.Module, *, sync_bn: bool = False, comm: Optional[CommHook] = None) -> DistributedDataParallel:
    """Problem 4: wrap `model` in DistributedDataParallel on this rank's device (the GPU
    initialize_group set; a model still on the CPU is moved there), so that backward all-reduces
    the gradients. `model` stays the plain module (checkpoints save it); DDP wraps it in place.

    SyncBatchNorm conversion reuses the BatchNorm parameters and buffers, so an
    optimiser built on `model` keeps working.

    BatchNorm statistics stay rank-local while training (forward_sync_buffers=False):
    they do not touch the gradients, rank 0's are the ones saved either way, and
    dist.broadcast_buffers gives every rank rank 0's before each evaluation. DDP's
    default broadcast at every forward would add a blocking collective to each step
    (5-10 % of a 2-rank CPU step here, docs/RESULTS.md).

    `comm` carries the bucket options and the gradient hook (--comm-hook); a profiled run
    gets its `allreduce b{k}` NVTX ranges from it.
    """
    comm = comm or CommHook()
    if sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_two_gpus[ddp --sync-bn]
    device = next(model.parameters()).device
    if device.type == "cpu" and torch.cuda.is_available() and tdist.get_backend() == "nccl":
        model = model.cuda()  # the lab's call may hand over a model still on the CPU
        device = next(model.parameters()).device
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  **comm.ddp_options(), **no_buffer_sync())
    return comm.register(ddp)
