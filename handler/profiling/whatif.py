"""What-if: from one report's summary JSON, the same mode's epoch at other process counts.

    python -m handler.profiling.whatif SUMMARY.json [--gpus 2,4] [--link RATE,LATENCY | --link Y.summary.json] [--grad-mb MB]

Reads only summary JSONs (numpy alone; no torch, no nsys), so a report summarised on another
machine can be predicted on a laptop. The step is split by resource in one place
(scaling/step.py, which the lab page's verdict reads too), each part scaled by scaling/scale.py;
the machine (cores, loader workers) is what the summary's `machine` block read, the link what a
report of 2 or more GPUs measured, else assumed and said so (scaling/links.py).
docs/PROFILING.md ("What-if") says how and why.
"""
import math
import sys
from pathlib import Path
from typing import TypedDict, cast

from handler.runtime.errors import OneLineParser, UserError, one_line_errors, shown

from .scaling.links import (CPU_LINK, FAST_NODE_LINK, NODE_LINK, P2P_LINK, THROUGH_HOST_LINK, Link, measured,
                            parse_link, payload)
from .scaling.epochs import could_move, line as epoch_line
from .scaling.facts import (GRAD_MB, RESNET18_GRAD_MB, Nodes, gpus_read, gradients, harness_mode, job_split,
                            machine_read, nodes_of, shape_of)
from .scaling.links import Payload
from .scaling.scale import PP_MICROBATCHES, Cell, Setting, predict
from .scaling.cores import cores_of, says
from .scaling.step import RESOURCES, Split

from .lab.metrics_file import read_json
from .nsys import REPORT_SUFFIXES
from .record.parse import parse_summary
from .record.summary import Machine, Summary

COUNTS = (1, 2, 4, 8)  # the lab matrix's process counts
MODEL_SECTION = "docs/PROFILING.md#the-what-ifs-model"
ASSUMPTIONS = (f"How the what-if predicts, and what it leaves out: [the what-if's model]({MODEL_SECTION}) "
               "(handler/profiling/whatif.py, handler/profiling/scaling/).")


def gradient_mb(model: str | None) -> float:
    return GRAD_MB.get(model or "", RESNET18_GRAD_MB)


class Prediction(TypedDict):
    """What `predictions` found: the split it started from, the mode, the links, what a step sends, the
    machine, the cells at every count (and over the alternative links where one was assumed)."""
    split: Split
    mode: str
    harness_mode: str
    mode_from: str
    link: Link
    between: Link | None
    nodes: Nodes
    sent: Payload
    grad_mb: float
    grad_from: str
    machine: Machine
    cells: list[Cell]
    through_host: list[Cell] | None
    fast_nodes: list[Cell] | None
    micro_from: str | None
    factors: dict[int, float]


def mode_of(summary: Summary, split: Split) -> str:
    """The what-if's shape of the run: dp (one process drives every GPU), pp (stages), else ddp."""
    return shape_of(harness_mode(summary, split)[0])


def run_mode(summary: Summary) -> str | None:
    """The harness's mode a report ran, where its run block, the page's cell or its name says it."""
    mode, said = harness_mode(summary, job_split(summary)[0])
    return None if said.startswith("assumed") else mode


def predictions(summary: Summary | dict[str, object], counts: tuple[int, ...] = COUNTS, link: Link | None = None,
                grad_mb: float | None = None, mode: str | None = None, factors: dict[int, float] | None = None,
                between: Link | None = None, per_node: int = 0) -> Prediction:
    """{"split", "mode", "link", "between", "sent", "machine", "cells", "through_host"}: the report's own
    count and every count asked for; "through_host": the same cells over THROUGH_HOST_LINK where the
    GPU link was assumed (else None). mode: the caller's (the lab page's row, compare's cell), read
    after the run's own; `between`: the link between nodes (a --link of a job of several nodes, whose
    nodes held `per_node` GPUs). A dict is parsed first (record/parse.py)."""
    summary = parse_summary(summary, "the summary")
    split, micro_from = job_split(summary)
    gpus_read(split, summary)
    harness, mode_from = harness_mode(summary, split, mode)
    shape = shape_of(harness)
    grad, grad_from, model = gradients(summary, grad_mb)
    sent = payload(grad, model, summary.comm_config, split.buckets, harness)
    nodes = nodes_of(summary, split, per_node)
    own_link = measured(split, summary, sent, "from this report's communication")
    if nodes.nodes > 1 and own_link:  # a job's ring across its nodes is bound by the link between them
        between = between or Link(own_link.gbit, own_link.latency_us, own_link.source + ", between nodes")
    own_link = None if nodes.nodes > 1 else own_link
    chosen = link or own_link or (P2P_LINK if split.gpu else CPU_LINK)
    spans = any(nodes.at(n) > 1 for n in counts)
    between = between or (NODE_LINK if spans else None)
    machine = machine_read(summary.machine)
    own = split.devices if split.gpu else split.processes
    wanted = sorted({own, *counts})

    def cells(over: Link, across: Link | None = between) -> list[Cell]:
        setting = Setting(shape, over, sent, machine, factors or {}, across, nodes.per_node)
        return [predict(split, n, setting) for n in wanted]
    alternative = cells(THROUGH_HOST_LINK) if split.gpu and chosen.assumed and shape != "pp" else None
    other_nodes = cells(chosen, FAST_NODE_LINK) if spans and between and between.assumed and shape == "ddp" else None
    return {"split": split, "mode": shape, "harness_mode": harness, "mode_from": mode_from, "link": chosen,
            "between": between, "nodes": nodes, "sent": sent, "grad_mb": grad, "grad_from": grad_from,
            "machine": machine, "cells": cells(chosen), "through_host": alternative, "fast_nodes": other_nodes,
            "micro_from": micro_from, "factors": factors or {}}


def devices(n: int, gpu: bool) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}" if gpu else f"{n} CPU process{'es' if n > 1 else ''}"


def fact_rows(found: Prediction) -> list[tuple[str, str, str]]:
    """What the prediction read and what it assumed: (fact, value, where it was read)."""
    m, link, split, nodes, between = found["machine"], found["link"], found["split"], found["nodes"], found["between"]
    rows = [("mode", found["harness_mode"], found["mode_from"]),
            ("link", f"{_rate(link)}, {link.latency_us:g} us a message", link.source)]
    if nodes.per_node:
        rows.append(("nodes", f"{nodes.nodes} of {nodes.per_node}: counts past {nodes.per_node} span nodes", nodes.from_))
        if between:
            rows.append(("link between nodes", f"{_rate(between)}: a ring across nodes rides it", between.source))
    rows.append(("sent a step", "no all-reduce (pp)", "the mode") if found["mode"] == "pp" else
                ("sent a step", found["sent"].says, found["grad_from"]))
    host = f" (the host has {m.cpu_cores})" if m.rank_cores and m.cpu_cores and m.cpu_cores != m.rank_cores else ""
    said = f"the ranks' cores, {m.rank_cores_from or 'recorded'}" if m.rank_cores else m.cpu_cores_from
    not_said = "" if m.cpu_cores_from == "not recorded" else f"{m.cpu_cores_from}; "
    rows.append(("CPU cores", f"{cores_of(m)}{host}", said) if cores_of(m) else
                ("CPU cores", "not recorded", f"{not_said}assumed: every loader gets cores of its own"))
    rows.append(("loader workers per process", f"{m.loader_workers:g}", m.loader_workers_from or "not said")
                if m.loader_workers is not None else
                ("loader workers per process", "not recorded",
                 f"{m.loader_workers_from or 'not recorded'}; assumed: 1 core per loader"))
    if not split.gpu and found["mode"] != "dp":
        rows.append(("CPU compute at other counts", *_cpu_facts(m, found["factors"])))
    if found["mode"] == "dp":
        rows.append(("dp", "one process drives every GPU: its broadcast and gather cross the link", "the mode"))
    return rows + _microbatches(found)


def facts(found: Prediction) -> str:
    """fact_rows as a markdown table."""
    return "\n".join(["| fact | value | where it was read |", "|---|---|---|",
                      *(f"| {fact} | {value} | {where} |" for fact, value, where in fact_rows(found))])


def _rate(link: Link) -> str:
    return "unbounded" if math.isinf(link.gbit) else f"{link.gbit:.3g} Gbit/s"


def _microbatches(found: Prediction) -> list[tuple[str, str, str]]:
    pipe = found["split"].pipeline
    if found["mode"] != "pp" or not pipe:
        return []
    if pipe.microbatches:
        return [("pp micro-batches", str(pipe.microbatches), found["micro_from"] or "not said")]
    return [("pp micro-batches", str(PP_MICROBATCHES), "not recorded: the harness default assumed")]


def _cpu_facts(m: Machine, factors: dict[int, float]) -> tuple[str, str]:
    """Where a CPU run's compute at other counts came from (scale.cpu_compute's order): (value, where)."""
    measured = ", ".join(f"{n}: x{f:.2f}" for n, f in sorted(factors.items()))
    if m.loader_cpu_ms is not None and cores_of(m):
        shared = f"the cores shared by the ranks and their loaders: {says(m)}"
        if factors:
            return (f"{measured} of that share", f"{shared}; the threads' efficiency other reports here measured "
                                                 "(their own loaders taken out)")
        return ("held at x1.00 (n ranks of fewer threads compute as one rank of more)",
                f"{shared}; no other report here measured the threads' efficiency at other counts")
    if factors:
        return f"{measured}, held at the other counts", f"measured by other reports here ({says(m)})"
    return "held at other counts", f"no other report of this machine measured them; {says(m)}"


def markdown(found: Prediction, title: str, measured_s: dict[int, float] | None = None) -> list[str]:
    """A table of the predicted cells (beside `measured_s`: count -> epoch s, where known); below it
    the base's measured epoch (scaling/epochs.py) and, where it is noisy, how far each cell could move."""
    split = found["split"]
    alts = [(name, cells) for name, cells in (("through host s", found["through_host"]),
                                              ("nodes at 100 Gbit/s s", found.get("fast_nodes"))) if cells]
    own = split.devices if split.gpu else split.processes
    nodes = found["nodes"]
    base = split.measured or {}
    noisy = bool(base.get("noisy"))
    lines = [f"From {title} ({devices(own, split.gpu)}, {split.steps_per_epoch:g} steps an epoch):", "", facts(found),
             *(["", f"The link is assumed: the column `through host s` predicts over {THROUGH_HOST_LINK.source[9:]}."]
               if found["through_host"] else []),
             *(["", f"The link between nodes is assumed: the column `nodes at 100 Gbit/s s` predicts over "
                f"{FAST_NODE_LINK.source[9:]}."] if found.get("fast_nodes") else []), "",
             "| " + " | ".join(["count", "predicted epoch s", *(["could move s"] if noisy else []),
                                *(name for name, _ in alts),
                                *(["measured s", "error"] if measured_s else []), "loader keeps up s", "step ms",
                                "bound"]) + " |",
             "|---" * (5 + len(alts) + (2 if measured_s else 0) + (1 if noisy else 0)) + "|"]
    for k, c in enumerate(found["cells"]):
        seen = (measured_s or {}).get(c["count"])
        error = "its report" if c["count"] == own else f"{(c['epoch_s'] - seen) / seen * 100:+.0f} %" if seen else ""
        extra = [f"{seen:.2f}" if seen else "", error] if measured_s else []
        span = f" ({nodes.at(c['count'])} nodes)" if nodes.at(c["count"]) > 1 else ""
        move = ["%.2f-%.2f" % could_move(base, c["epoch_s"])] if noisy else []
        lines.append("| " + " | ".join([devices(c["count"], split.gpu) + span, f"{c['epoch_s']:.2f}", *move,
                                        *(f"{cells[k]['epoch_s']:.2f}" for _, cells in alts), *extra,
                                        f"{c['keeps_up_epoch_s']:.2f}", f"{c['step_ms']:.1f}", c["bound"]]) + " |")
    if base:
        lines += ["", f"Base: {epoch_line(base, 'its measured epoch')}." + (
            " A prediction from a noisy base is as unsure as the column `could move s` says." if noisy else "")]
    return lines


def bounds_legend() -> list[str]:
    return [f"- **{name}**: {what}" for name, what in RESOURCES.items()]


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(c) for c in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise UserError(f"--gpus {text!r} is not a list of positive counts; write e.g. --gpus 2,4")
    return counts


def link_argument(text: str) -> tuple[Link, int]:
    """(link, GPUs per node where it is a link between nodes, else 0): --link RATE,LATENCY, or a .summary.json of a report of 2 or
    more GPUs of the same machine (a job of several nodes: the link between them). Its bytes are its
    own run's gradients (its run.grad_mb or model), never the predicted run's --grad-mb."""
    if not text.endswith(".json"):
        return parse_link(text), 0
    other = load_summary(Path(text))
    split = job_split(other)[0]
    grad, _, model = gradients(other)
    found = measured(split, other, payload(grad, model, other.comm_config, split.buckets, run_mode(other)),
                     f"from {Path(text).name}'s communication")
    if not found:
        raise UserError(f"--link {text}: that report ran one process or recorded no communication, so it measures "
                        "no link; pass the summary of a report of 2 or more GPUs (or CPU processes), or RATE,LATENCY")
    nodes = nodes_of(other, split)
    return found, nodes.per_node if nodes.nodes > 1 else 0


def load_summary(path: Path) -> Summary:
    data = _summary_json(path)
    keys = {str(k) for k in cast(dict[object, object], data)} if isinstance(data, dict) else set[str]()
    if {"config", "epochs"} <= keys and "ranks" not in keys:
        raise UserError(f"{path} is the run's metrics JSON (train_cifar.py --metrics), not a profile summary; "
                        f"{SUMMARISE} on the run's report and pass the .summary.json it writes")
    summary = parse_summary(cast(object, data), str(path))
    cut = summary.incomplete
    if cut and not cut.complete_epochs:
        raise UserError(f"{path}: {cut.line or 'the run ended before its first epoch did'}: nothing to predict "
                        "from; profile a run that finishes at least one epoch")
    return summary


SUMMARISE = "run python -m handler.profiling.report"


def _summary_json(path: Path) -> object:
    """The summary file's JSON; UserError saying what the path is instead."""
    fix = "pass a .summary.json written by python -m handler.profiling.report"
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.summary.json"))
        raise UserError(f"{path} is a folder; " + (f"pass one of its summaries: {', '.join(found[:4])}" if found else
                        f"it holds no .summary.json: {SUMMARISE} {path} first"))
    if path.name.endswith(".summary.md"):
        raise UserError(f"{path} is the summary for people (markdown); pass the .summary.json beside it")
    if path.suffix in (".sqlite", *REPORT_SUFFIXES):
        raise UserError(f"{path} is an nsys report, not its summary; {SUMMARISE} {path}, then pass the "
                        ".summary.json it writes")
    return read_json(path, str(path), fix)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m handler.profiling.whatif", description=(__doc__ or "").split("\n")[0])
    p.add_argument("summary", type=Path, help="a .summary.json from python -m handler.profiling.report")
    p.add_argument("--gpus", default=",".join(map(str, COUNTS)), help="counts to predict (default 1,2,4,8)")
    p.add_argument("--link", help="RATE,LATENCY (Gbit/s, microseconds per message), or Y.summary.json: a report of "
                                  "2 or more GPUs of the same machine, whose NCCL kernels give the link (default: "
                                  "the report's own, else assumed and said so)")
    p.add_argument("--grad-mb", type=float, help="MB of fp32 gradients all-reduced per step (default: the run's "
                                                 f"model's, where the summary names it, else {RESNET18_GRAD_MB}: ResNet-18)")
    args = p.parse_args(argv)
    counts = parse_counts(args.gpus)
    if args.grad_mb is not None and not (args.grad_mb > 0 and math.isfinite(args.grad_mb)):
        raise UserError(f"--grad-mb {args.grad_mb:g} is not a size (a finite number of MB > 0); give the "
                        "gradients' MB, e.g. --grad-mb 44.7")
    link, per_node = link_argument(args.link) if args.link else (None, 0)
    summary = load_summary(args.summary)
    found = predictions(summary, counts, None if per_node else link, args.grad_mb, between=link if per_node else None,
                        per_node=per_node)
    print(shown("\n".join([*markdown(found, args.summary.name), "", ASSUMPTIONS, "", *bounds_legend()])))
    return 0


if __name__ == "__main__":
    with one_line_errors("whatif"):
        sys.exit(main())
