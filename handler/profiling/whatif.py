"""What-if: from one report's summary JSON, the same mode's epoch at other process counts.

    python -m handler.profiling.whatif SUMMARY.json [--gpus 2,4] [--link RATE,LATENCY] [--grad-mb MB]

Reads only the summary JSON (numpy alone; no torch, no nsys), so a report summarised on
another machine can be predicted on a laptop. Each phase of a step goes to the resource it
runs on; `ASSUMPTIONS` says how they scale, docs/PROFILING.md ("What-if") why. The all-reduce
is bench.comm's step-time model (bench/comm_model.py, "The model" in docs/COMM.md).
"""
import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.comm_model import exchange_s, line_time, ring_messages, ring_share, step_s
from handler.runtime.errors import UserError, one_line_errors
from handler.runtime.names import BACKWARD, DATA, FORWARD, H2D, OPTIMIZER

from .lab.summary_check import check_summary

COUNTS = (1, 2, 4, 8)  # the lab matrix's process counts
POWER = 4.0  # how the CPU's and the wire's bounds add: every quiet bench.comm fit chose 4 (docs/COMM.md)
BETA = 1.0  # link efficiency: the shaped link carried 99 % of its rate (bench.comm, docs/COMM.md)
RESNET18_GRAD_MB = 44.696  # fp32 gradients of ResNet-18 (models/, checked by a test): the lab's model
# MB of fp32 gradients each model of models/ all-reduces per step (a test counts them); read here,
# not counted, so the what-if needs no torch. A model not listed is taken as ResNet-18.
GRAD_MB = {"resnet18": RESNET18_GRAD_MB, "resnet20": 1.079, "fastnet": 12.416}


def gradient_mb(model: str | None) -> float:
    return GRAD_MB.get(model or "", RESNET18_GRAD_MB)
FIRST_BUCKET_MB, BUCKET_CAP_MB = 1.0, 25.0  # DDP's buckets: a small first one, then --bucket-cap-mb


@dataclass(frozen=True)
class Link:
    """The all-reduce's link: rate in Gbit/s, latency in microseconds per ring message."""
    gbit: float
    latency_us: float
    source: str = "given"


DEFAULT_LINKS = {"gpu": Link(100.0, 10.0, "assumed: PCIe between GPUs of one host"),
                 "cpu": Link(10.0, 50.0, "assumed: gloo over loopback TCP on one host")}
ASSUMPTIONS = (
    "Model (handler/profiling/whatif.py): the global batch and the steps per epoch stay as in the report; each "
    "process gets its share of the batch. The wait for data between and inside steps goes to the host's CPU cores: "
    "with GPUs each process's loader gets cores of its own, so the wait shrinks with the processes (one process, "
    "dp's, keeps it); on a CPU run the loaders and the ranks share the same cores, so it stays. Forward, backward "
    "and optimizer go to the device: on GPUs each rank's GPU does its share (busy time over the processes) while the "
    "host's launch work inside the step stays; on a CPU run the ranks share the host's cores, so the step's compute "
    "stays. The all-reduce goes to the link: bench.comm's model (docs/COMM.md), a ring of 2(n-1) messages "
    "carrying 2(n-1)/n of the gradients, its floor the report's own all-reduce time, the part backward hides "
    "scaling with the compute. A GPU step is the larger of (loader wait + host work) and the GPU's busy time, plus "
    "the exposed all-reduce; a CPU step is their sum. The bound of a cell is its largest term. Not modelled: host "
    "cores running out when every GPU's loader shares them, dp's scatter and gather, batch-size effects on kernels.")
BOUND_NAMES = {"loader": "loader (host CPU cores)", "host": "kernel launches (host)", "device": "GPU",
               "link": "link (all-reduce)", "cores": "host cores (compute)"}


@dataclass(frozen=True)
class Base:
    """One report's step, split by resource (seconds per step, on its slowest rank)."""
    processes: int
    devices: int  # GPUs, or the processes on a CPU run
    gpu: bool
    steps_per_epoch: float
    wait: float  # loader: between steps, plus `data` and `h2d` inside
    host: float  # inside the step, less the wait and the exposed all-reduce
    busy: float  # GPU compute busy time; the host work on a CPU run
    comm: float | None  # all-reduce time measured; None when the report has none
    window: float  # all-reduce hidden behind backward
    buckets: int


def base_of(summary: dict, grad_mb: float = RESNET18_GRAD_MB, bucket_cap_mb: float | None = None) -> Base:
    """The report's slowest rank, its step split by resource. UserError when it has no steps."""
    ranks = summary.get("ranks") or []
    usable = [r for r in ranks if (r.get("loop") or {}).get("steps")]
    if not usable:
        raise UserError("the summary has no training steps (ranks[].loop.steps); summarise a report of a training "
                        "run with python -m handler.profiling.report")
    rank = max(usable, key=lambda r: r["loop"]["epochs_s"])
    loop, steps = rank["loop"], rank["loop"]["steps"]
    # the lab page's rows keep no per-epoch list, only the mean epoch (`epoch_s`)
    epochs = len(rank.get("epochs") or ()) or max(1, round(loop["epochs_s"] / (summary.get("epoch_s") or loop["epochs_s"])))
    phase = {k: (v or 0.0) / 1e3 for k, v in (loop.get("phase_ms") or {}).items()}
    wait = (loop.get("between_steps_ms") or 0.0) / 1e3 + phase.get(DATA, 0.0) + phase.get(H2D, 0.0)
    comm_stats = rank.get("comm") or {}
    comm = comm_stats["seconds"] / steps if comm_stats.get("seconds") else None
    exposed = (comm_stats.get("exposed_s") or 0.0) / steps
    host = max(0.0, (loop.get("inside_steps_ms") or 0.0) / 1e3 - phase.get(DATA, 0.0) - phase.get(H2D, 0.0) - exposed)
    gpus = summary.get("gpus") or []
    busy = max((g["compute_busy_share"] * g["epochs_s"] / steps for g in gpus), default=None)
    compute = sum(phase.get(p, 0.0) for p in (FORWARD, BACKWARD, OPTIMIZER))
    device = busy if busy is not None else host
    window = comm - exposed if comm is not None else (phase.get(BACKWARD, 0.0) / compute * device if compute else 0.0)
    buckets = comm_stats.get("buckets") or default_buckets(grad_mb, bucket_cap_mb or BUCKET_CAP_MB)
    return Base(processes=len(ranks), devices=len(gpus) or len(ranks), gpu=busy is not None,
                steps_per_epoch=steps / epochs, wait=wait, host=host, busy=device, comm=comm,
                window=max(0.0, window), buckets=int(buckets))


def default_buckets(grad_mb: float, cap_mb: float) -> int:
    """DDP's buckets for grad_mb of gradients: the first of 1 MB, then cap_mb each."""
    return 1 + max(0, math.ceil((grad_mb - FIRST_BUCKET_MB) / cap_mb))


def link_from(base: Base, grad_mb: float, given: Link | None) -> Link:
    """The given link; else, from a report of 2 or more processes, the rate its all-reduce time
    implies (after the default latency of its messages); else the default for its device."""
    default = DEFAULT_LINKS["gpu" if base.gpu else "cpu"]
    if given:
        return given
    if base.processes < 2 or not base.comm:
        return default
    latency = default.latency_us / 1e6 * ring_messages(base.processes, base.buckets, 1) / base.buckets
    wire_s = base.comm - latency
    if wire_s <= 0:
        return Link(math.inf, default.latency_us, "from the report's all-reduce: latency-bound")
    gbit = ring_share(base.processes) * grad_mb * 1e6 * 8 / wire_s / 1e9 * BETA
    return Link(gbit, default.latency_us, "from the report's all-reduce ranges")


def comm_at(base: Base, n: int, link: Link, grad_mb: float) -> float:
    """All-reduce seconds per step at n processes: bench.comm's exchange_s; its floor is a one-process
    report's own all-reduce time (no wire), 0 for a report of several (their time is the wire's)."""
    floor = base.comm if (base.comm is not None and base.processes == 1) else 0.0
    if n < 2:
        return floor
    wire = BETA * line_time(ring_share(n) * grad_mb * 1e6, link.gbit * 1e3) if math.isfinite(link.gbit) else 0.0
    return exchange_s(floor, wire, ring_messages(n, base.buckets, 1), base.buckets, link.latency_us / 1e6, POWER)


def predict(base: Base, n: int, link: Link, grad_mb: float, one_process: bool = False) -> dict:
    """The epoch at n GPUs (or CPU processes): step terms, the epoch, the epoch with a loader
    that keeps up, and the bound. one_process: dp, one process driving every GPU, no all-reduce."""
    processes = 1 if one_process else n
    if base.gpu:
        wait = base.wait * (1 if one_process else base.processes / processes)
        device = base.busy * base.devices / n
        window = base.window * device / base.busy if base.busy else 0.0
    else:
        wait, device, window = base.wait, base.busy, base.window  # one host's cores, whatever the ranks
    comm = 0.0 if one_process else comm_at(base, processes, link, grad_mb)
    exposed = step_s(0.0, comm, window)
    if base.gpu:  # the GPU runs while the host loads and launches: the longer of the two
        step, keeps_up = max(wait + base.host, device) + exposed, max(base.host, device) + exposed
    else:  # one host's cores do it all, in turn
        step, keeps_up = wait + device + exposed, device + exposed
    terms = {"loader": wait, "link": exposed, **({"host": base.host, "device": device} if base.gpu else {"cores": device})}
    bound = max(terms, key=lambda k: terms[k])
    return {"count": n, "processes": processes, "step_ms": step * 1e3, "epoch_s": step * base.steps_per_epoch,
            "keeps_up_epoch_s": keeps_up * base.steps_per_epoch, "terms_ms": {k: v * 1e3 for k, v in terms.items()},
            "comm_ms": comm * 1e3, "bound": BOUND_NAMES[bound]}


def predictions(summary: dict, counts=COUNTS, link: Link | None = None, grad_mb: float = RESNET18_GRAD_MB,
                one_process: bool = False) -> dict:
    """{"base", "link", "cells"}: the report's own count and every count asked for."""
    cap = (summary.get("comm_config") or {}).get("bucket_cap_mb")
    base = base_of(summary, grad_mb, cap)
    chosen = link_from(base, grad_mb, link)
    cells = [predict(base, n, chosen, grad_mb, one_process) for n in sorted({base.devices, *counts})]
    return {"base": base, "link": chosen, "grad_mb": grad_mb, "one_process": one_process, "cells": cells}


def is_one_process(summary: dict) -> bool:
    """dp (one process drives every GPU): the kit's dp_<time>/ folder or a dp_ name."""
    report = summary.get("report") or ""
    parts = Path(report[0] if isinstance(report, list) else report).parts[-2:]
    return any(p == "dp" or p.startswith(("dp_", "dp.")) for p in parts)


def devices(n: int, gpu: bool) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}" if gpu else f"{n} CPU process{'es' if n > 1 else ''}"


def markdown(found: dict, title: str, measured: dict | None = None) -> list[str]:
    """A table of the predicted cells (beside `measured`: count -> epoch s, where known)."""
    base, link = found["base"], found["link"]
    rate = "unbounded" if math.isinf(link.gbit) else f"{link.gbit:.3g} Gbit/s"
    dp = "; one process drives every GPU (dp): no all-reduce" if found["one_process"] else ""
    lines = [f"From {title} ({devices(base.devices, base.gpu)}, {base.steps_per_epoch:g} steps an epoch): link "
             f"{rate}, {link.latency_us:g} us a message ({link.source}); gradients {found['grad_mb']:.3g} MB{dp}.", "",
             "| " + " | ".join(["count", "predicted epoch s", *(["measured s", "error"] if measured else []),
                                "loader keeps up s", "step ms", "bound"]) + " |",
             "|---" * (5 + (2 if measured else 0)) + "|"]
    for c in found["cells"]:
        seen = (measured or {}).get(c["count"])
        error = "its report" if c["count"] == base.devices else f"{(c['epoch_s'] - seen) / seen * 100:+.0f} %" if seen else ""
        extra = [f"{seen:.2f}" if seen else "", error] if measured else []
        lines.append("| " + " | ".join([devices(c["count"], base.gpu), f"{c['epoch_s']:.2f}", *extra,
                                        f"{c['keeps_up_epoch_s']:.2f}", f"{c['step_ms']:.1f}", c["bound"]]) + " |")
    return lines


def lab_section(rows: list[dict]) -> list[str]:
    """The lab page's what-if section (handler/profiling/lab/page.py): per mode, from its
    report on the fewest GPUs, every count of the matrix beside the measured ones."""
    lines = ["", "## What-if: the next run, predicted", "", ASSUMPTIONS, ""]
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        base = min(mine, key=lambda r: r["gpus"])
        summary = {"ranks": base["ranks"], "gpus": base["gpu_table"], "epoch_s": base["epoch_s"]}
        measured = {r["gpus"]: r["epoch_s"] for r in mine if r["epoch_s"]}
        try:
            found = predictions(summary, one_process=mode == "dp", grad_mb=gradient_mb(base.get("model")))
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


def parse_counts(text: str) -> tuple:
    try:
        counts = tuple(int(c) for c in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise UserError(f"--gpus {text!r} is not a list of positive counts; write e.g. --gpus 2,4")
    return counts


def parse_link(text: str) -> Link:
    try:
        gbit, latency = (float(v) for v in text.split(","))
    except ValueError:
        gbit = latency = -1.0
    if not (gbit > 0 and latency >= 0 and math.isfinite(gbit + latency)):
        raise UserError(f"--link {text!r} is not RATE,LATENCY; write the rate in Gbit/s and the latency in "
                        "microseconds per message, e.g. --link 100,10")
    return Link(gbit, latency)


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
    p.add_argument("--link", help="RATE,LATENCY: the link in Gbit/s and microseconds per message "
                                  "(default: from the report's all-reduce, else assumed and said so)")
    p.add_argument("--grad-mb", type=float, default=RESNET18_GRAD_MB,
                   help=f"MB of gradients all-reduced per step (default {RESNET18_GRAD_MB}: ResNet-18 in fp32)")
    args = p.parse_args(argv)
    counts, link = parse_counts(args.gpus), parse_link(args.link) if args.link else None
    if not (args.grad_mb > 0 and math.isfinite(args.grad_mb)):
        raise UserError(f"--grad-mb {args.grad_mb:g} is not a size (a finite number of MB > 0); give the "
                        "gradients' MB, e.g. --grad-mb 44.7")
    summary = load_summary(args.summary)
    found = predictions(summary, counts, link, args.grad_mb, is_one_process(summary))
    print("\n".join([*markdown(found, args.summary.name), "", ASSUMPTIONS]))
    return 0


if __name__ == "__main__":
    with one_line_errors("whatif"):
        sys.exit(main())
