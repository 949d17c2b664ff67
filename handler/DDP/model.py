"""Wrapping a model for DDP: the only place the DDP modes touch the model."""
import torch
from torch.nn.parallel import DistributedDataParallel


def model_to_DDP(model: torch.nn.Module, sync_bn: bool = False) -> DistributedDataParallel:
    """`model` stays the plain module (checkpoints save it); DDP wraps it in place.

    SyncBatchNorm conversion reuses the BatchNorm parameters and buffers, so an
    optimiser built on `model` keeps working.

    BatchNorm statistics stay rank-local while training (forward_sync_buffers=False):
    they do not touch the gradients, rank 0's are the ones saved either way, and
    dist.broadcast_buffers gives every rank rank 0's before each evaluation. DDP's
    default broadcast at every forward would add a blocking collective to each step
    (5-10 % of a 2-rank CPU step here, docs/RESULTS.md).
    """
    if sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   forward_sync_buffers=False)
