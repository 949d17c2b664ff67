"""Wrapping a model for DDP: the only place the DDP modes touch the model."""
import torch
from torch.nn.parallel import DistributedDataParallel


def model_to_DDP(model: torch.nn.Module, sync_bn: bool = False) -> DistributedDataParallel:
    """`model` stays the plain module (checkpoints save it); DDP wraps it in place.

    SyncBatchNorm conversion reuses the BatchNorm parameters and buffers, so an
    optimiser built on `model` keeps working.
    """
    if sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
