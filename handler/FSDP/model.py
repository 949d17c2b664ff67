"""Sharding a model with FSDP2's fully_shard: the only place the fsdp mode touches it."""
import torch
from torch.distributed.fsdp import fully_shard

from .old_torch import gloo_reduce_policy, patch_cpu_fsdp


def model_to_FSDP(model: torch.nn.Module) -> torch.nn.Module:
    """Shard each stage as its own unit (so only one stage's parameters are gathered at
    a time), then the rest at the root. fully_shard changes `model` in place.

    FSDP2 shards only contiguous parameters, so --channels-last keeps them in NCHW: the
    inputs alone stay channels_last, and cuDNN and oneDNN pick their NHWC convolutions when
    the input or the weight is channels_last (ConvUtils.h), so the speed-up remains."""
    model = model.to(memory_format=torch.contiguous_format)
    if next(model.parameters()).device.type == "cpu":
        patch_cpu_fsdp()
    policy = gloo_reduce_policy()
    for stage in getattr(model, "stages", ()):
        fully_shard(stage, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model
