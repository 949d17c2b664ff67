"""One split of a training step by the resource each part runs on, from a summary JSON.

The lab page's verdict (lab/page.py), the what-if (whatif.py), compare's predictions and
the lab page's what-if section all read a report through `split_of`, and name what bounds a
step with `bound_of`, so they cannot disagree. The wait for data is whatever the naming
convention (conventions.py) put there: the time between the step ranges (the kit's loop
fetches its batch there) plus the `data` and `h2d` phases inside them (ours fetches inside
`batch i`). Only complete epochs count: a run killed inside an epoch never closes its range,
and analysis.loop_stats counts the steps of the closed epochs alone. The step is the measured
epoch (epochs.py: the warm-up left out, the median of the rest) over its steps; the parts,
measured over every complete epoch, are scaled in proportion to it (`_at_measured`), so they
still add up to it.
"""
from dataclasses import dataclass, replace

from handler.runtime.errors import UserError
from handler.runtime.names import BACKWARD, DATA, FORWARD, H2D, OPTIMIZER

from ..record.parse import parse_summary
from ..record.summary import Comm, Rank, Summary
from .epochs import Measured, of_summary

GPU_BOUND = 0.8  # a GPU busy this share of the host's work inside the step: that work is the wait for it
# What bounds a step, in the words the verdict and the what-if both print (docs/PROFILING.md).
BOUNDS = {"loader": "loader-bound", "host": "host-bound", "device": "GPU-bound", "cores": "CPU-bound",
          "link": "link-bound"}
RESOURCES = {"loader-bound": "the wait for data: the host's CPU cores running the loaders",
             "host-bound": "the host's work inside the step: launching kernels, Python",
             "GPU-bound": "the GPU's compute", "CPU-bound": "the host's cores computing (no GPU ran)",
             "link-bound": "the exposed communication: the all-reduce (dp: its broadcast and gather)"}


@dataclass(frozen=True)
class Stages:
    """pp's pipeline: its stages, micro-batches (None: not recorded), where they came from, and the longest
    stage's span per step (s)."""
    stages: int
    microbatches: int | None
    from_: str
    span: float


@dataclass(frozen=True)
class Split:
    """The slowest rank's step over its complete epochs (seconds per step). At the report's own
    count wait + host + exposed is the measured step, and the GPU's busy time fits inside it."""
    processes: int
    devices: int  # GPUs that ran kernels, or the processes of a CPU run
    gpu: bool
    epochs: int
    steps_per_epoch: float
    step: float  # measured: the measured epoch (epochs.py) over its steps
    wait: float  # the wait for data: between the steps, plus `data` and `h2d` inside them
    host: float  # inside the steps, less the wait and the exposed communication
    busy: float  # the busiest GPU's compute per step; the host work on a CPU run
    comm: float | None  # communication per step measured (all-reduce ranges or NCCL kernels); None: none
    exposed: float  # the part of it no compute hid
    buckets: int | None  # the all-reduce's buckets, where the report counted them
    compute_share: float  # backward's share of forward + backward + optimizer: the window behind it
    pipeline: Stages | None  # pp only
    measured: Measured | None = None  # the measured epoch the step is from (epochs.of_summary); None: the mean


def split_of(summary: Summary | dict[str, object]) -> Split:
    """UserError when no rank has a complete epoch with steps in it. A dict is parsed first (record/)."""
    summary = parse_summary(summary, "the summary")
    usable = [r for r in summary.ranks if r.loop.epochs and r.loop.steps and r.loop.epochs_s > 0]
    if not usable:
        raise UserError("the report has no complete epoch with training steps (a run stopped inside its first "
                        "epoch never closes the epoch's range); profile a run that finishes at least one epoch")
    rank = max(usable, key=lambda r: r.loop.epochs_s)
    loop = rank.loop
    steps, epochs = loop.steps, loop.epochs
    step = loop.epochs_s / steps
    # a time the records take 1e-9 below 0 (float rounding: an epoch less its steps) is none
    phase = {k: max(0.0, v or 0.0) / 1e3 for k, v in loop.phase_ms.items()}
    inside = min(step, max(0.0, loop.inside_steps_ms or 0.0) / 1e3)
    fetch = min(inside, phase.get(DATA, 0.0) + phase.get(H2D, 0.0))
    comm_stats = rank.comm or Comm()
    comm = comm_stats.seconds / steps if comm_stats.seconds else None
    exposed = min(inside - fetch, max(0.0, comm_stats.exposed_s or 0.0) / steps)
    wait, host = step - inside + fetch, inside - fetch - exposed
    gpus = summary.gpus or []
    shares = [(g.kernel_busy_share if g.compute_busy_share is None else g.compute_busy_share, g.epochs_s) for g in gpus]
    busy_s = [s * (e or loop.epochs_s) / steps for s, e in shares if s is not None]
    # the GPU's compute and the exposed communication share the step: its busy time fits beside it
    busy = min(max(busy_s), step - exposed) if busy_s else host
    compute = sum(phase.get(p, 0.0) for p in (FORWARD, BACKWARD, OPTIMIZER))
    split = Split(processes=len(summary.ranks), devices=len(gpus) or len(summary.ranks), gpu=bool(busy_s),
                  epochs=epochs, steps_per_epoch=steps / epochs, step=step, wait=wait, host=host, busy=busy, comm=comm,
                  exposed=exposed, buckets=comm_stats.buckets or None,
                  compute_share=phase.get(BACKWARD, 0.0) / compute if compute else 0.0,
                  pipeline=_pipeline(summary.ranks, steps))
    return _at_measured(split, of_summary(summary))


def _at_measured(split: Split, measured: Measured) -> Split:
    """The split with its step the measured epoch's (epochs.py) and every part, measured over all the
    complete epochs, scaled by the same factor: they still add up to the step, and the GPU's busy
    time still fits inside it. Unchanged where no epoch was timed."""
    if not measured["s"]:
        return split
    k = measured["s"] / split.steps_per_epoch / split.step
    return replace(split, step=split.step * k, wait=split.wait * k, host=split.host * k, busy=split.busy * k,
                   comm=None if split.comm is None else split.comm * k, exposed=split.exposed * k, measured=measured)


def _pipeline(ranks: list[Rank], steps: int) -> Stages | None:
    """pp's stages, micro-batches and the longest stage's pipeline span per step. The micro-batches:
    what a stage entry counted (bubble.py, at any stage count), else M from the theoretical bubble
    (W-1)/(M+W-1) of a summary older than the count; at one stage that bubble is 0 whatever M."""
    stages = [r.pipeline for r in ranks if r.pipeline]
    if not stages:
        return None
    count, theory = len(stages), stages[0].theoretical_bubble_share or 0.0
    recorded = stages[0].microbatches
    if recorded:
        microbatches, said = recorded, "the report's micro-batch ranges"
    elif theory:
        microbatches, said = max(1, round((count - 1) * (1 - theory) / theory)), "the report's theoretical bubble"
    else:
        microbatches, said = None, "not recorded (one stage has no bubble to read them from)"
    return Stages(count, microbatches, said, max((s.span_s or 0.0) for s in stages) / steps)


def bound_of(terms: dict[str, float]) -> str:
    """The largest part of a step, in the verdict's and the what-if's words. terms: loader,
    link, and host and device (GPU runs) or cores (CPU runs). A GPU busy GPU_BOUND of the host's
    work or more is the bound where that work is: the host then mostly waits for it."""
    work = "cores" if "cores" in terms else "device" if terms["device"] >= GPU_BOUND * terms["host"] else "host"
    candidates = {"loader": terms["loader"], "link": terms["link"],
                  work: terms[work] if work == "cores" else max(terms["host"], terms["device"])}
    return BOUNDS[max(candidates, key=lambda k: candidates[k])]


def step_of(terms: dict[str, float], gpu: bool) -> tuple[float, float]:
    """(step, step with a loader that keeps up). The GPU runs while the host loads and launches:
    the longer of the two; one host's cores do it all in turn on a CPU run."""
    if gpu:
        return (max(terms["loader"] + terms["host"], terms["device"]) + terms["link"],
                max(terms["host"], terms["device"]) + terms["link"])
    return terms["loader"] + terms["cores"] + terms["link"], terms["cores"] + terms["link"]


def own_terms(split: Split) -> dict[str, float]:
    """The terms at the report's own count, as measured."""
    work = {"host": split.host, "device": split.busy} if split.gpu else {"cores": split.busy}
    return {"loader": split.wait, "link": split.exposed, **work}
