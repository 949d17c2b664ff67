"""Splitting a model into W contiguous pipeline stages, and running one of them.

The models expose `stem`, `stages` (a ModuleList of Sequentials of blocks) and
`forward_head`. The split's unit is a block, numbered across the model's stages: the
first pipeline stage also holds the stem, the last the head. `balanced_split` is the
one chooser: `--pp-split params` feeds it parameters per model stage (cuts only at the
model's own stage boundaries), `--pp-split time` measured milliseconds per block
(handler/PP/timing.py; docs/MODES.md).
"""
from typing import Any, List, Sequence, Tuple, cast

import torch
import torch.nn as nn

from models.staged import StagedModel


def _params(module: Any) -> int:
    return sum(p.numel() for p in cast(nn.Module, module).parameters())


def model_stages(model: nn.Module) -> List[nn.Sequential]:
    """The model's own stages (models/resnet.py: a ModuleList of Sequentials of blocks)."""
    return [cast(nn.Sequential, stage) for stage in cast(nn.ModuleList, model.stages)]


def blocks(model: nn.Module) -> List[Tuple[int, int]]:
    """(model stage, block within it) of every block, in forward order."""
    return [(i, j) for i, stage in enumerate(model_stages(model)) for j in range(len(stage))]


def unit_params(model: StagedModel) -> List[int]:
    """Parameters per model stage, counting the stem with the first and the head with the last."""
    sizes = [_params(stage) for stage in model_stages(model)]
    sizes[0] += _params(model.stem)
    sizes[-1] += _params(model.head)
    return sizes


def balanced_split(costs: Sequence[float], parts: int) -> List[range]:
    """The contiguous groups of units, `parts` of them, that minimise the largest group's
    sum: exact, by dynamic programming over the last cut. Ties keep the earliest cuts,
    so equal costs give the same split on every rank and every run."""
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} units into {parts} non-empty groups")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[k][i]: the smallest possible maximum when the first i units form k groups.
    best = [[float("inf")] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    bounds, i = [n], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    bounds.reverse()
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stage_groups_to_blocks(groups: List[range], model: nn.Module) -> List[range]:
    """Groups of model stages -> the same groups as ranges of block numbers."""
    starts = [0]
    for stage in model_stages(model):
        starts.append(starts[-1] + len(stage))
    return [range(starts[g[0]], starts[g[-1] + 1]) for g in groups]


def _name(model: nn.Module, units: range) -> str:
    """`stages 0-1`, `stage 2`, or `blocks 1.2-2.0` when a model stage is cut inside."""
    index = blocks(model)
    (i0, j0), (i1, j1) = index[units[0]], index[units[-1]]
    if j0 == 0 and j1 == len(model_stages(model)[i1]) - 1:
        return f"stages {i0}-{i1}" if i1 > i0 else f"stage {i0}"
    return f"blocks {i0}.{j0}-{i1}.{j1}" if units[-1] > units[0] else f"block {i0}.{j0}"


def describe(model: nn.Module, groups: List[range], weights: Sequence[float], unit: str) -> str:
    """One clause per pipeline stage: what it holds and its weight (`unit` formats it)."""
    parts = []
    for s, g in enumerate(groups):
        what = [_name(model, g)]
        if s == 0:
            what.insert(0, "stem")
        if s == len(groups) - 1:
            what.append("head")
        parts.append(f"pp stage {s} = {' + '.join(what)} ({unit.format(weights[s])})")
    return "; ".join(parts)


def _runs(model: nn.Module, units: range) -> List[nn.Module]:
    """The model's own Sequentials, sliced to this stage's blocks. A slice keeps its
    class, so a stage wrapped by --activation-checkpointing recomputes as before."""
    index = blocks(model)
    runs = []
    for i in sorted({index[u][0] for u in units}):
        mine = [j for u, (k, j) in enumerate(index) if k == i and u in units]
        stage = model_stages(model)[i]
        runs.append(stage if len(mine) == len(stage) else stage[mine[0]:mine[-1] + 1])
    return runs


class StageModule(nn.Module):
    """This process's slice of the forward pass. It runs the (pruned) model's own
    submodules, so parameter names stay those of the unsplit model and checkpoints keep
    the plain format."""

    def __init__(self, model: StagedModel, units: range, first: bool, last: bool, autocast, wire_dtype):
        super().__init__()
        self.model, self.units, self.first, self.last = model, units, first, last
        self.autocast, self.wire_dtype = autocast, wire_dtype
        self._runs = tuple(_runs(model, units))  # a tuple: not registered twice as submodules

    def forward(self, x):
        with self.autocast():
            if self.first:
                x = cast(nn.Module, self.model.stem)(x)
            for run in self._runs:
                x = run(x)
            if self.last:
                return cast(Any, self.model).forward_head(x).float()
        # A fixed dtype and a plain layout between stages: the receiving stage allocates its
        # buffers from them (and gloo sends only contiguous tensors, not channels_last ones).
        return x.to(self.wire_dtype).contiguous()


def prune(model: StagedModel, units: range, first: bool, last: bool) -> None:
    """Drop (in place) every part of the model this stage does not run."""
    for u, (i, j) in enumerate(blocks(model)):
        if u not in units:
            model_stages(model)[i][j] = nn.Identity()
    if not first:
        model.stem = nn.Identity()
    if not last:
        model.head = nn.Identity()


@torch.no_grad()
def boundary_shapes(model: nn.Module, device) -> List[Tuple[int, ...]]:
    """Per-image activation shape after each block, from a one-image eval forward
    (eval: BatchNorm statistics stay untouched)."""
    was_training = model.training
    model.eval()
    x = cast(nn.Module, model.stem)(torch.zeros(1, 3, 32, 32, device=device))
    shapes = []
    for i, j in blocks(model):
        x = model_stages(model)[i][j](x)
        shapes.append(tuple(x.shape[1:]))
    model.train(was_training)
    return shapes
