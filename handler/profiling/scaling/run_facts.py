"""The run's own facts in the summary (its `run` block, docs/PROFILING.md "The summary's contract"):
the mode, the model and its gradients' MB, the nodes and GPUs per node, the processes, and pp's
stages and micro-batches, each with where it came from. Read in this order: the run's metrics JSON
(what it was asked to run), then the report itself (pp's ranges, one process driving several GPUs),
then the report's file or folder name, last and said so.
"""
import re
from pathlib import Path
from typing import Any

from .facts import GRAD_MB  # the table by model name, for runs from before the metrics recorded it


MODES = ("ddp_dali", "ddp", "fsdp", "dp", "pp")  # longest first: ddp_dali_gpu2 is ddp_dali, not ddp
# a mode's name opening a file or folder name: ours `ddp_gpu2`, the kit's `dp_<time>/`, compare's `dp-n1`
NAMED = re.compile(rf"({'|'.join(MODES)})(?=$|[_.+\-])")
UNKNOWN = "not recorded"
Data = dict[str, Any]  # the summary being written and the metrics as data (the writer's side of record/)
Report = str | Path | list[str] | None


def run_block(summary: Data, metrics: Data | None = None, report: Report = None) -> Data:
    """summary: as analysis.summarize (or merge.merge) built it, with `ranks` and `gpus` (each GPU
    with its `host` in a job). report: the report's path, or a job's list of them (the last source)."""
    config: Data = (metrics or {}).get("config") or {}
    env: Data = (metrics or {}).get("env") or {}
    ranks: list[Data] = summary["ranks"]
    gpus: list[Data] = summary.get("gpus") or []
    mode, mode_from = _mode(config, ranks, gpus, report)
    model = config.get("model")
    grad, grad_from = _grad_mb(metrics, model)
    hosts = {r.get("host") for r in ranks}
    per_node: dict[str | None, int] = {}
    for g in gpus:
        per_node[g.get("host")] = per_node.get(g.get("host"), 0) + 1
    stages = [r["pipeline"] for r in ranks if r.get("pipeline")]
    micro, pp_from = _microbatches(config, stages)
    nodes, processes, nodes_from = _job(env, config, len(hosts), len(ranks))
    return {"mode": mode, "mode_from": mode_from,
            "model": model, "model_from": "metrics config.model" if model else f"{UNKNOWN}: no metrics JSON with config.model",
            "grad_mb": grad, "grad_mb_from": grad_from,
            "nodes": nodes, "gpus_per_node": max(per_node.values(), default=0), "processes": processes,
            "nodes_from": nodes_from, "pp_stages": len(stages) or None, "pp_microbatches": micro, "pp_from": pp_from}


def _job(env: Data, config: Data, hosts: int, ranks: int) -> tuple[int, int, str]:
    """(nodes, processes, where from): the report's hosts and ranks, or the metrics' env.nodes and world
    size where they say more (one node's report of a job of several: the job's, not the node's)."""
    nodes: int = env.get("nodes") or 0
    world: int = env.get("world_size") or config.get("world_size") or 0
    if nodes <= hosts and world <= ranks:
        return max(1, hosts), ranks, "report: the ranks' hosts"
    return (max(1, hosts, nodes), max(ranks, world),
            f"metrics env.nodes {nodes or hosts} and world size {world or ranks}: this report holds {ranks} of the "
            f"job's ranks on {hosts} host{'s' * (hosts != 1)}")


def _mode(config: Data, ranks: list[Data], gpus: list[Data], report: Report) -> tuple[str | None, str]:
    if config.get("mode") in MODES:
        return config["mode"], "metrics config.mode"
    if any(r.get("pipeline") for r in ranks):
        return "pp", "report: pp's `fwd mb`/`bwd mb` ranges"
    if gpus and len(ranks) < len(gpus):
        return "dp", f"report: {len(ranks)} process{'es' * (len(ranks) != 1)} drove {len(gpus)} GPUs"
    for path in ([report] if isinstance(report, (str, Path)) else report or []):
        for part in reversed(Path(path).parts[-2:]):
            if found := NAMED.match(part):
                return found.group(1), f"file name {Path(path).name}: the report alone cannot tell ddp, ddp_dali and fsdp apart"
    return None, f"{UNKNOWN}: no metrics JSON, and neither the report nor its name says it"


def _grad_mb(metrics: Data | None, model: str | None) -> tuple[float | None, str]:
    size: Data = (metrics or {}).get("model") or {}
    recorded = size.get("grad_mb")
    if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and recorded > 0:
        return float(recorded), "metrics model.grad_mb: the run counted its parameters"
    if model in GRAD_MB:
        return GRAD_MB[model], f"whatif.GRAD_MB of {model}: the run's metrics do not record model.grad_mb"
    return None, f"{UNKNOWN}: model {model or UNKNOWN}, and whatif.GRAD_MB lists {', '.join(GRAD_MB)}"


def _microbatches(config: Data, stages: list[Data]) -> tuple[int | None, str | None]:
    """pp's micro-batches: the metrics' config.microbatches, else the one whose theoretical bubble the
    report's `fwd mb{j}` ranges gave (bubble.py counts them)."""
    if not stages:
        return None, None
    if isinstance(config.get("microbatches"), int) and config["microbatches"] >= 1:
        return config["microbatches"], "metrics config.microbatches; stages: the report's pp ranges"
    if stages[0].get("microbatches"):  # bubble.py counts them at any stage count, one included
        return stages[0]["microbatches"], "report: the stages and micro-batches of its `fwd mb{j}` ranges"
    return None, "not read: the report's pp stages counted no micro-batch"
