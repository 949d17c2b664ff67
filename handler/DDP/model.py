"""Wrapping a model for DDP: the only place the DDP modes touch the model."""
import torch
from torch.nn.parallel import DistributedDataParallel


def model_to_DDP(model: torch.nn.Module) -> DistributedDataParallel:
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
