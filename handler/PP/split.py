"""Which blocks each pipeline stage runs (`--pp-split`, docs/MODES.md).

`params` balances parameter count over the model's own stages (what a stage must hold:
pipelining is the answer when a model does not fit). `time` balances the measured
forward + backward time of one micro-batch over blocks, which is what sets the pace of
a pipeline. Rank 0 decides and broadcasts its decision, so every rank runs the same cut
even though timings differ between machines and runs.
"""
from typing import Any, Dict, List, Optional, cast

import torch.distributed as tdist
import torch.nn as nn

from ..runtime import dist
from models.staged import StagedModel
from .stages import balanced_split, blocks, describe, model_stages, stage_groups_to_blocks, unit_params
from .timing import TimingCache, cache_key, time_blocks

SPLITS = ("params", "time")


def _params_of(model: nn.Module, units: range, first: bool, last: bool) -> int:
    index, stages = blocks(model), model_stages(model)
    parts: List[nn.Module] = [stages[index[u][0]][index[u][1]] for u in units]
    parts += [cast(nn.Module, model.stem)] if first else []
    parts += [cast(nn.Module, model.head)] if last else []
    return sum(p.numel() for part in parts for p in part.parameters())


def _decide(model: nn.Module, how: str, parts: int, *, model_name: str, micro_batch: int, autocast,
            amp: str, channels_last: bool, cache_path: Optional[str]) -> Dict[str, Any]:
    """The split as a plain dict (what the metrics record): blocks per stage and why."""
    record: Dict[str, Any] = {"how": how, "micro_batch": micro_batch}
    if how == "params":
        groups = stage_groups_to_blocks(balanced_split(unit_params(cast(StagedModel, model)), parts), model)
    else:
        checkpointed = type(model_stages(model)[0]) is not nn.Sequential
        # The name with the size: two models under one name (tests, benches) never share timings.
        shape = f"{model_name} ({sum(p.numel() for p in model.parameters())} parameters, {len(blocks(model))} blocks)"
        key = cache_key(shape, micro_batch, next(model.parameters()).device, amp, channels_last, checkpointed)
        cache = TimingCache(cache_path)
        timing = cache.get(key)
        record.update(cache=cache_path, cache_hit=timing is not None)
        if timing is None:
            timing = time_blocks(model, micro_batch, autocast, channels_last)
            cache.put(key, timing)
        if cache.problem:
            record["cache_problem"] = cache.problem
        costs = [f + b for f, b in zip(timing["fwd_ms"], timing["bwd_ms"])]
        groups = balanced_split(costs, parts)
        record.update(block_fwd_ms=[round(t, 3) for t in timing["fwd_ms"]],
                      block_bwd_ms=[round(t, 3) for t in timing["bwd_ms"]],
                      stage_ms=[round(sum(costs[u] for u in g), 3) for g in groups])
    last = len(groups) - 1
    record.update(stage_blocks=[[g.start, g.stop] for g in groups], cuts=[g.start for g in groups[1:]],
                  stage_params=[_params_of(model, g, s == 0, s == last) for s, g in enumerate(groups)])
    return record


def plan_split(model: nn.Module, how: str, **options: Any) -> Dict[str, Any]:
    """Rank 0's split, on every rank (a collective: every rank calls it)."""
    parts = tdist.get_world_size()
    box: List[Optional[Dict[str, Any]]] = [None]
    if tdist.get_rank() == 0:
        box[0] = _decide(model, how, parts, **options)
    tdist.broadcast_object_list(box, src=0, group=cast(tdist.ProcessGroup, dist.cpu_group()))
    record = box[0]
    assert record is not None
    groups = [range(a, b) for a, b in record["stage_blocks"]]
    if how == "params":
        text = describe(model, groups, [p / 1e6 for p in record["stage_params"]], "{:.2f}M params")
        record["text"] = f"split by parameter count: {text}"
    else:
        text = describe(model, groups, record["stage_ms"], "{:.1f} ms fwd+bwd per micro-batch")
        hit = "cached" if record["cache_hit"] else "measured"
        record["text"] = (f"split by time ({hit}, micro-batch {record['micro_batch']}, "
                          f"{record['cache'] or 'not cached'}): {text}")
    return record


def stage_units(record: Dict[str, Any], index: int) -> range:
    a, b = record["stage_blocks"][index]
    return range(a, b)
