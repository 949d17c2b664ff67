"""Model-level options applied after the model is built; the models stay plain."""
import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from models.staged import StagedModel

# The mixin's super() is the stage's own nn.Module class; the checker sees that base.
_StageBase = torch.nn.Module if TYPE_CHECKING else object


class _Checkpointed(_StageBase):
    """Mixed in front of a stage's own class: recompute its activations in backward.

    A class, not a closure put on the instance: DataParallel's replicas copy the
    instance's __dict__, so a closure would run cuda:0's weights on every GPU, while a
    method resolves `self` to each replica.
    """

    def forward(self, x):
        if torch.is_grad_enabled():
            return checkpoint(super().forward, x, use_reentrant=False)
        return super().forward(x)


@functools.lru_cache(maxsize=None)
def _checkpointed(cls: type) -> type:
    return type(f"Checkpointed{cls.__name__}", (_Checkpointed, cls), {})


def checkpoint_stages(model: StagedModel) -> None:
    """Recompute each stage's activations in backward instead of storing them.

    Only the stage's class changes, so parameter names and checkpoints are the same as
    without it. BatchNorm running statistics see the recomputed forward too (a known
    property of activation checkpointing); gradients are unchanged.
    """
    for stage in model.stages:
        stage.__class__ = _checkpointed(type(stage))


def cross_entropy(model, images, labels):
    """The default criterion: (mean loss, number correct)."""
    logits = model(images)
    return F.cross_entropy(logits, labels), (logits.detach().argmax(1) == labels).sum()
