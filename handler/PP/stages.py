"""Splitting a model into W pipeline stages at its own stage boundaries.

The models expose `stem`, `stages` (a ModuleList) and `forward_head`. A pipeline stage
is a contiguous run of them: the first also holds the stem, the last the head. The
split balances parameter count (what a stage must hold, with its gradients and
optimizer state), not FLOPs: pipelining is the answer when the model does not fit.
"""
from itertools import combinations
from typing import List, Tuple

import torch
import torch.nn as nn

from models.staged import StagedModel


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def unit_params(model: StagedModel) -> List[int]:
    """Parameters per model stage, counting the stem with the first and the head with the last."""
    sizes = [_params(stage) for stage in model.stages]
    sizes[0] += _params(model.stem)
    sizes[-1] += _params(model.head)
    return sizes


def balanced_split(sizes: List[int], parts: int) -> List[range]:
    """Contiguous groups of units, `parts` of them, minimising the largest group's sum
    (exhaustive: models have a handful of stages)."""
    n = len(sizes)
    best = None
    for cuts in combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        groups = [range(a, b) for a, b in zip(bounds, bounds[1:])]
        key = max(sum(sizes[i] for i in g) for g in groups)
        if best is None or key < best[0]:
            best = (key, groups)
    assert best is not None, "check_options refuses more pipeline stages than model stages"
    return best[1]


def describe(groups: List[range], sizes: List[int]) -> str:
    """One line per run: which model stages each pipeline stage holds, and its parameters."""
    parts = []
    for s, g in enumerate(groups):
        what = [f"stages {g[0]}-{g[-1]}" if len(g) > 1 else f"stage {g[0]}"]
        if s == 0:
            what.insert(0, "stem")
        if s == len(groups) - 1:
            what.append("head")
        parts.append(f"pp stage {s} = {' + '.join(what)} ({sum(sizes[i] for i in g) / 1e6:.2f}M params)")
    return "split by parameter count: " + "; ".join(parts)


class StageModule(nn.Module):
    """This process's slice of the forward pass. It runs the (pruned) model's own
    submodules, so parameter names stay those of the unsplit model and checkpoints keep
    the plain format."""

    def __init__(self, model: StagedModel, units: range, first: bool, last: bool, autocast, wire_dtype):
        super().__init__()
        self.model, self.units, self.first, self.last = model, units, first, last
        self.autocast, self.wire_dtype = autocast, wire_dtype

    def forward(self, x):
        with self.autocast():
            if self.first:
                x = self.model.stem(x)
            for i in self.units:
                x = self.model.stages[i](x)
            if self.last:
                return self.model.forward_head(x).float()
        # A fixed dtype and a plain layout between stages: the receiving stage allocates its
        # buffers from them (and gloo sends only contiguous tensors, not channels_last ones).
        return x.to(self.wire_dtype).contiguous()


def prune(model: StagedModel, units: range, first: bool, last: bool) -> None:
    """Drop (in place) every part of the model this stage does not run."""
    for i in range(len(model.stages)):
        if i not in units:
            model.stages[i] = nn.Identity()
    if not first:
        model.stem = nn.Identity()
    if not last:
        model.head = nn.Identity()


@torch.no_grad()
def boundary_shapes(model: StagedModel, device) -> List[Tuple[int, ...]]:
    """Per-image activation shape after each model stage, from a one-image eval forward
    (eval: BatchNorm statistics stay untouched)."""
    was_training = model.training
    model.eval()
    x = model.stem(torch.zeros(1, 3, 32, 32, device=device))
    shapes = []
    for stage in model.stages:
        x = stage(x)
        shapes.append(tuple(x.shape[1:]))
    model.train(was_training)
    return shapes
