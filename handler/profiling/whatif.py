"""What-if: from one report's summary JSON, the same mode's epoch at other process counts.

    python -m handler.profiling.whatif SUMMARY.json [--gpus 2,4] [--link RATE,LATENCY | --link Y.summary.json] [--grad-mb MB]

Reads only summary JSONs (numpy alone; no torch, no nsys), so a report summarised on another
machine can be predicted on a laptop. The step is split by resource in one place
(scaling/step.py, which the lab page's verdict reads too), each part scaled by scaling/scale.py;
the machine (cores, loader workers) is what the summary's `machine` block read, the link what a
report of 2 or more GPUs measured, else assumed and said so (scaling/links.py).
docs/PROFILING.md ("What-if") says how and why.
"""
import argparse
import json
import math
import sys
from pathlib import Path

from handler.runtime.errors import UserError, one_line_errors

from .scaling.links import CPU_LINK, P2P_LINK, THROUGH_HOST_LINK, Link, measured, parse_link, payload
from .scaling.cores import cores_of, says
from .scaling.scale import Setting, cpu_factors, predict
from .scaling.step import RESOURCES, Split, split_of

from .lab.summary_check import check_summary

COUNTS = (1, 2, 4, 8)  # the lab matrix's process counts
RESNET18_GRAD_MB = 44.696  # fp32 gradients of ResNet-18 (models/, checked by a test): the lab's model
# MB of fp32 gradients each model of models/ all-reduces per step (a test counts them); read here,
# not counted, so the what-if needs no torch. A model not listed is taken as ResNet-18, and said so.
GRAD_MB = {"resnet18": RESNET18_GRAD_MB, "resnet20": 1.079, "fastnet": 12.416}
ASSUMPTIONS = (
    "Model (handler/profiling/whatif.py, handler/profiling/scaling/): the global batch and the steps per epoch stay "
    "as in the report. The step splits into the wait for data (between the step ranges and the `data`/`h2d` phases "
    "inside them), the host's work inside the step, the GPU's busy time and the communication no compute hid; at the "
    "report's own count they add up to its measured step. The wait goes to the loaders' cores: each process's "
    "loader uses its workers' cores (its own thread without workers) beside one core for each rank's main thread, "
    "up to the host's cores read from the report (past them it stops shrinking); dp and pp (one loader) keep it; a "
    "CPU run's loaders share the ranks' cores, so it stays. The host's work stays; the GPU's busy time splits over "
    "the GPUs. A CPU run's cores are one resource: its compute spreads over the ranks' threads (up to the cores), "
    "and its loaders' CPU time, measured by the run (metrics epochs[].cpu_time; else nsys' scheduler events), lands on the ranks' cores, "
    "stalling a rank whose threads meet at every operator for the share of it on its cores (all of it for one "
    "rank of every core, 1/n for n ranks of one core each); a run that recorded no CPU time takes its compute at "
    "n from another mode's reports of the same machine, else holds it, and says so. ddp's all-reduce is the ring model "
    "(handler/profiling/scaling/comm_model.py; bench.comm checks it) of what its comm hook sends (docs/COMM.md), "
    "fsdp's 1.5 times its gradients (two gathers, one reduce-scatter), hidden "
    "behind backward where it can be; dp's broadcast and gather cross the link "
    "one GPU at a time; pp has no all-reduce, its pipeline span follows the bubble (M + W - 1 slots of 1/W of the "
    "work). A GPU step is the larger of (wait + host work) and the GPU's busy time, plus the exposed communication; "
    "a CPU step is their sum. The bound is the largest part, in the lab page verdict's words. Not modelled: pp's "
    "activations between stages, batch-size effects on kernels.")


def gradient_mb(model: str | None) -> float:
    return GRAD_MB.get(model or "", RESNET18_GRAD_MB)


def mode_of(summary: dict, split: Split) -> str:
    """dp (one process drives every GPU: the kit's dp_<time>/ folder or a dp_ name), pp (stages), else ddp."""
    if _named(summary, "dp") or (split.gpu and split.processes < split.devices):
        return "dp"
    return "pp" if split.pipeline else "ddp"


def run_mode(summary: dict) -> str | None:
    """The harness's mode a report ran, where its summary or its name says it (fsdp sends its own bytes)."""
    if summary.get("run_mode"):
        return summary["run_mode"].split()[0].split("+")[0]
    return "fsdp" if _named(summary, "fsdp") else None


def _named(summary: dict, mode: str) -> bool:
    """Whether the report's file or folder is named for `mode` (mode, mode_..., mode.xxx: ours and the kit's)."""
    report = summary.get("report") or ""
    parts = Path(report[0] if isinstance(report, list) else report).parts[-2:]
    return any(p == mode or p.startswith((f"{mode}_", f"{mode}.")) for p in parts)


def predictions(summary: dict, counts=COUNTS, link: Link | None = None, grad_mb: float | None = None,
                mode: str | None = None, factors: dict | None = None) -> dict:
    """{"split", "mode", "link", "sent", "machine", "cells", "through_host"}: the report's own count and
    every count asked for; "through_host": the same cells over THROUGH_HOST_LINK where the GPU link
    was assumed (else None)."""
    split = split_of(summary)
    mode = mode or mode_of(summary, split)
    model = summary.get("model")
    grad = grad_mb or gradient_mb(model)
    grad_from = ("--grad-mb" if grad_mb else f"{model}'s gradients" if model in GRAD_MB
                 else f"model {model or 'not recorded'}: ResNet-18's gradients assumed")
    sent = payload(grad, model, summary.get("comm_config"), split.buckets, run_mode(summary))
    chosen = link or measured(split, summary, sent, "from this report's communication") or \
        (P2P_LINK if split.gpu else CPU_LINK)
    machine = summary.get("machine") or {}
    own = split.devices if split.gpu else split.processes
    wanted = sorted({own, *counts})

    def cells(over: Link) -> list:
        setting = Setting(mode, over, sent, machine, factors or {})
        return [predict(split, n, setting) for n in wanted]
    alternative = cells(THROUGH_HOST_LINK) if split.gpu and chosen.assumed and mode != "pp" else None
    return {"split": split, "mode": mode, "link": chosen, "sent": sent, "grad_mb": grad, "grad_from": grad_from, "machine": machine,
            "cells": cells(chosen), "through_host": alternative, "factors": factors or {}}


def devices(n: int, gpu: bool) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}" if gpu else f"{n} CPU process{'es' if n > 1 else ''}"


def facts(found: dict) -> str:
    """What the prediction read and what it assumed, in one sentence."""
    m, link = found["machine"], found["link"]
    rate = "unbounded" if math.isinf(link.gbit) else f"{link.gbit:.3g} Gbit/s"
    cores = f"{m['cpu_cores']} CPU cores ({m['cpu_cores_from']})" if m.get("cpu_cores") else \
        "CPU cores not recorded (assumed: every loader gets cores of its own)"
    workers = (f"{m['loader_workers']:g} loader workers per process ({m['loader_workers_from']})"
               if m.get("loader_workers") is not None else
               f"loader workers {m.get('loader_workers_from') or 'not recorded'} (assumed: 1 core per loader)")
    split = found["split"]
    held = "" if split.gpu or found["mode"] == "dp" else _cpu_facts(m, found["factors"])
    comm = "no all-reduce (pp)" if found["mode"] == "pp" else f"sends {found['sent'].says} a step ({found['grad_from']})"
    return (f"link {rate}, {link.latency_us:g} us a message ({link.source}); {comm}; {cores}; {workers}{held}"
            + ("; dp: one process drives every GPU, its broadcast and gather cross the link" if found["mode"] == "dp"
               else ""))


def _cpu_facts(m: dict, factors: dict) -> str:
    """Where a CPU run's compute at other counts came from (scale.cpu_compute's order)."""
    if m.get("loader_cpu_ms") is not None and cores_of(m):
        return f"; the cores shared by the ranks and their loaders: {says(m)}"
    if factors:
        return (f"; CPU compute at {', '.join(f'{n}: x{f:.2f}' for n, f in sorted(factors.items()))} measured by "
                f"other reports here, held at the other counts ({says(m)})")
    return f"; CPU compute held at other counts (no other report of this machine measured them; {says(m)})"


def markdown(found: dict, title: str, measured_s: dict | None = None) -> list[str]:
    """A table of the predicted cells (beside `measured_s`: count -> epoch s, where known)."""
    split, alt = found["split"], found["through_host"]
    own = split.devices if split.gpu else split.processes
    lines = [f"From {title} ({devices(own, split.gpu)}, {split.steps_per_epoch:g} steps an epoch): {facts(found)}.",
             *([f"The link is assumed: the column `through host s` predicts over {THROUGH_HOST_LINK.source[9:]}."]
               if alt else []), "",
             "| " + " | ".join(["count", "predicted epoch s", *(["through host s"] if alt else []),
                                *(["measured s", "error"] if measured_s else []), "loader keeps up s", "step ms",
                                "bound"]) + " |",
             "|---" * (5 + (1 if alt else 0) + (2 if measured_s else 0)) + "|"]
    for k, c in enumerate(found["cells"]):
        seen = (measured_s or {}).get(c["count"])
        error = "its report" if c["count"] == own else f"{(c['epoch_s'] - seen) / seen * 100:+.0f} %" if seen else ""
        extra = [f"{seen:.2f}" if seen else "", error] if measured_s else []
        lines.append("| " + " | ".join([devices(c["count"], split.gpu), f"{c['epoch_s']:.2f}",
                                        *([f"{alt[k]['epoch_s']:.2f}"] if alt else []), *extra,
                                        f"{c['keeps_up_epoch_s']:.2f}", f"{c['step_ms']:.1f}", c["bound"]]) + " |")
    return lines


def bounds_legend() -> list[str]:
    return [f"- **{name}**: {what}" for name, what in RESOURCES.items()]


def lab_section(rows: list[dict]) -> list[str]:
    """The lab page's what-if section (handler/profiling/lab/page.py): per mode, from its report on
    the fewest GPUs, every count of the matrix beside the measured ones; the GPU link from the
    folder's own reports of 2 or more GPUs; a CPU run's cores from its own CPU time, else its compute at n
    from other modes' reports."""
    lines = ["", "## What-if: the next run, predicted", "", ASSUMPTIONS, "", *bounds_legend(), ""]
    try:
        summaries = {id(r): _summary_of(r) for r in rows}
        splits: dict[str, dict[int, Split]] = {}
        for r in rows:
            try:
                splits.setdefault(r["mode"], {})[r["gpus"]] = split_of(summaries[id(r)])
            except UserError:
                continue
        link = _folder_link(rows, summaries, splits)
    except Exception as err:  # what the folder's reports say of the machine; never the page
        return [*lines, f"No prediction: the what-if could not read the machine from these reports "
                        f"({type(err).__name__}: {err}); the rest of the page stands.", ""]
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        base = min(mine, key=lambda r: r["gpus"])
        summary = summaries[id(base)]
        measured = {r["gpus"]: r["epoch_s"] for r in mine if r["epoch_s"]}
        try:
            found = predictions(summary, link=link if base["gpus_ran"] else None, mode=_mode(mode, base),
                                factors=_factors(mode, base, splits))
            table = markdown(found, f"the {mode} report", measured)
        except UserError as err:
            cut = base.get("incomplete")  # a run cut short before its first epoch ended says so, not "no steps"
            lines += [f"- **{mode}**: no prediction: {cut['line'] if cut and not cut['complete_epochs'] else err}.", ""]
            continue
        except Exception as err:  # a row the model cannot take costs its own line, never the page
            lines += [f"- **{mode}**: no prediction: the what-if model failed on this report "
                      f"({type(err).__name__}: {err}); the rest of the page stands.", ""]
            continue
        lines += [f"### {mode}", "", *table, ""]
    return lines


def _summary_of(row: dict) -> dict:
    return {"ranks": row["ranks"], "gpus": row["gpu_table"], "model": row.get("model"), "report": row["report"],
            "machine": row.get("machine"), "comm_config": row.get("comm_config"), "run_mode": row.get("mode")}


def _mode(mode: str, row: dict) -> str:
    """The lab page's modes are the kit's names (or compare's labels, which start with the mode)."""
    name = _name(mode)
    return "dp" if name == "dp" or row.get("processes", 0) < row.get("gpus_ran", 0) else "pp" if name == "pp" else "ddp"


def _name(mode: str) -> str:
    """The mode a lab-page row names: `dp`, or compare's `dp+amp [fp16]`, is dp."""
    return mode.split()[0].split("+")[0]


def _folder_link(rows: list[dict], summaries: dict, splits: dict) -> Link | None:
    """The GPU link a report of 2 or more GPUs in the folder measured (one process per GPU)."""
    for r in sorted(rows, key=lambda r: -r["gpus"]):
        split = splits.get(r["mode"], {}).get(r["gpus"])
        if split is None or not split.gpu or _mode(r["mode"], r) != "ddp":
            continue
        summary = summaries[id(r)]
        try:
            sent = payload(gradient_mb(r.get("model")), r.get("model"), summary.get("comm_config"), split.buckets,
                           run_mode(summary))
        except UserError:  # its mode's section says why, in its own line
            continue
        found = measured(split, summary, sent, f"from the NCCL kernels of {r['mode']}, {r['gpus']} GPUs in this folder")
        if found:
            return found
    return None


def _factors(mode: str, base: dict, splits: dict) -> dict:
    """A CPU run's compute at other counts, from the other modes of rank-per-process (not dp, not pp):
    used where the run recorded no CPU time (scale.cpu_compute)."""
    if base["gpus_ran"] or _mode(mode, base) != "ddp":
        return {}
    others = {m: by for m, by in splits.items() if m != mode and _name(m) not in ("dp", "pp")
              and all(not s.gpu for s in by.values())}
    return cpu_factors(others, base["gpus"])


def parse_counts(text: str) -> tuple:
    try:
        counts = tuple(int(c) for c in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise UserError(f"--gpus {text!r} is not a list of positive counts; write e.g. --gpus 2,4")
    return counts


def link_argument(text: str, grad_mb: float | None) -> Link:
    """--link RATE,LATENCY, or a .summary.json of a report of 2 or more GPUs of the same machine."""
    if not text.endswith(".json"):
        return parse_link(text)
    other = load_summary(Path(text))
    split = split_of(other)
    grad = grad_mb or gradient_mb(other.get("model"))
    found = measured(split, other, payload(grad, other.get("model"), other.get("comm_config"), split.buckets,
                                           run_mode(other)),
                     f"from {Path(text).name}'s communication")
    if not found:
        raise UserError(f"--link {text}: that report ran one process or recorded no communication, so it measures "
                        "no link; pass the summary of a report of 2 or more GPUs (or CPU processes), or RATE,LATENCY")
    return found


def load_summary(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; pass a .summary.json written by python -m handler.profiling.report") from None
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is not JSON ({err}); pass a .summary.json written by "
                        "python -m handler.profiling.report") from None
    summary = check_summary(data, str(path))
    cut = summary.get("incomplete")
    if cut and not cut["complete_epochs"]:
        raise UserError(f"{path}: {cut.get('line') or 'the run ended before its first epoch did'}: nothing to predict "
                        "from; profile a run that finishes at least one epoch")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m handler.profiling.whatif", description=(__doc__ or "").split("\n")[0])
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
    link = link_argument(args.link, args.grad_mb) if args.link else None
    summary = load_summary(args.summary)
    found = predictions(summary, counts, link, args.grad_mb)
    print("\n".join([*markdown(found, args.summary.name), "", ASSUMPTIONS, "", *bounds_legend()]))
    return 0


if __name__ == "__main__":
    with one_line_errors("whatif"):
        sys.exit(main())
