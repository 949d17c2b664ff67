"""The run's own facts a prediction reads, each with where it came from, derived here once from the
summary's `run` block (mode, model, gradients, nodes, GPUs per node, the job's processes, pp's
micro-batches; scaling/run_facts.py writes it from the metrics, the report and its name) and the
machine block's cores. An older summary without the block is read from the report's shape, its
file name and the model's table, and the first line says so. `job_split` is the one split every
prediction starts from: the report's, at the job's own count (one node's report of a bigger job
predicts the job, not its node), with pp's micro-batches as recorded.
"""
import dataclasses
import math
from pathlib import Path

from handler.runtime.errors import UserError

from ..record.summary import Machine, Run, Summary
from .links import Link
from .step import Split, split_of

RESNET18_GRAD_MB = 44.696  # fp32 gradients of ResNet-18 (models/, checked by a test): the lab's model
# MB of fp32 gradients each model of models/ all-reduces per step (a test counts them); read here,
# not counted, so the what-if needs no torch. A model not listed is taken as ResNet-18, and said so.
GRAD_MB = {"resnet18": RESNET18_GRAD_MB, "resnet20": 1.079, "fastnet": 12.416}
MODES = ("dp", "ddp", "ddp_dali", "fsdp", "pp")


def mode_name(text: str | None) -> str | None:
    """A harness mode from a mode or a label (compare's `dp+amp [fp16]` is dp); None if it names none."""
    name = (text or "").split()[0].split("+")[0] if (text or "").strip() else ""
    return name if name in MODES else None


def harness_mode(summary: Summary, split: Split, given: str | None = None) -> tuple[str, str]:
    """(mode, where it came from): the run's recorded mode, else the caller's (the lab page's row,
    compare's cell), else the report's shape (one process driving several GPUs: dp; stages: pp),
    else the file or folder name, the last resort; else ddp, assumed."""
    run = summary.run
    if run and run.mode:
        return run.mode, f"run.mode ({run.mode_from or 'recorded'})"
    for text in (given, summary.run_mode):
        if name := mode_name(text):
            return name, "the page's cell"
    if split.gpu and split.processes < split.devices:
        return "dp", "the report: one process drove every GPU"
    if split.pipeline:
        return "pp", "the report: pp's stage ranges"
    for mode in ("ddp_dali", "fsdp", "dp", "pp", "ddp"):
        if _named(summary, mode):
            return mode, f"the file name ({mode}...; the run recorded no mode)"
    return "ddp", "assumed ddp (the run recorded no mode and the report's name names none)"


def shape_of(mode: str) -> str:
    """The what-if's shape of a harness mode: dp (one process), pp (stages), else ddp (a rank per device)."""
    return mode if mode in ("dp", "pp") else "ddp"


def _named(summary: Summary, mode: str) -> bool:
    """Whether the report's file or folder is named for `mode` (mode, mode_..., mode.xxx, compare's mode-n2)."""
    report = summary.report or ""
    parts = Path(report[0] if isinstance(report, list) and report else report if isinstance(report, str) else "").parts[-2:]
    return any(p == mode or p.startswith((f"{mode}_", f"{mode}.", f"{mode}-")) for p in parts)


def gradients(summary: Summary, given: float | None = None) -> tuple[float, str, str | None]:
    """(MB of fp32 gradients a step, where from, the model): --grad-mb, else the run's own
    (run.grad_mb), else its model's (GRAD_MB), else ResNet-18's, assumed."""
    run = summary.run
    model = (run.model if run else None) or summary.model
    if given:
        return given, "--grad-mb", model
    if run and run.grad_mb:  # the table's size by the model's name is said as before; a counted one says so
        source = run.grad_mb_from or "recorded"
        said = f"{model}'s gradients" if source.startswith("whatif.GRAD_MB") and model else f"run.grad_mb ({source})"
        return run.grad_mb, said, model
    if model in GRAD_MB:
        return GRAD_MB[model], f"{model}'s gradients", model
    return RESNET18_GRAD_MB, f"model {model or 'not recorded'}: ResNet-18's gradients assumed", model


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The job's nodes and GPUs per node (0: every count on one node); `from_` says where from."""
    nodes: int
    per_node: int
    from_: str

    def at(self, n: int) -> int:
        """Nodes a run of n devices spans: as many per node as the job's nodes held."""
        return max(1, -(-n // self.per_node)) if self.per_node else 1

    def says(self, between: Link | None) -> str:
        """The nodes and the link between them, for the first line; "" where every count is on one node."""
        if not self.per_node:
            return ""
        said = (f"; {self.nodes} node{'s' * (self.nodes > 1)} of {self.per_node} ({self.from_}): counts past "
                f"{self.per_node} span nodes")
        if between is None:
            return said
        rate = "unbounded" if math.isinf(between.gbit) else f"{between.gbit:.3g} Gbit/s"
        return said + f", their ring bound by the link between nodes, {rate} ({between.source})"


def nodes_of(summary: Summary, split: Split, per_node: int = 0) -> Nodes:
    """per_node: GPUs per node of a --link job of several nodes, where this report ran on one."""
    run = summary.run
    nodes = run.nodes if run else 1
    devices = split.devices if split.gpu else split.processes
    if nodes > 1 and run:
        per = run.gpus_per_node if split.gpu else 0
        said = "" if run.nodes_from.startswith("report") else f": {run.nodes_from}"
        return Nodes(nodes, per or -(-devices // nodes), f"run.nodes{said}")
    if per_node:
        return Nodes(1, per_node, "as many GPUs per node as the --link job's nodes held")
    return Nodes(1, 0, "run.nodes" if run else "one node (the run recorded no nodes)")


def gpus_read(split: Split, summary: Summary) -> None:
    """A run that recorded GPUs (run.gpus_per_node) but whose summary holds no GPU's busy time would be
    predicted as CPU processes: one line instead."""
    per_node = summary.run.gpus_per_node if summary.run else 0
    if per_node and not split.gpu:
        raise UserError(f"the run ran on GPUs (run.gpus_per_node {per_node}) but its summary holds no GPU's busy "
                        "time (`gpus`), so it would be predicted as CPU processes; profile with CUDA traced "
                        "(nsys --trace cuda,nvtx) and summarise the report again")


def pipeline_of(split: Split, run: Run | None) -> tuple[Split, str | None]:
    """pp's micro-batches: run.pp_microbatches, else what the report read (step._pipeline says how)."""
    if not split.pipeline:
        return split, None
    if run and run.pp_microbatches:
        pipe = dataclasses.replace(split.pipeline, microbatches=run.pp_microbatches,
                                   stages=run.pp_stages or split.pipeline.stages)
        return dataclasses.replace(split, pipeline=pipe), f"run.pp_microbatches ({run.pp_from or 'recorded'})"
    return split, split.pipeline.from_


def job_split(summary: Summary) -> tuple[Split, str | None]:
    """(the split at the job's own count, where pp's micro-batches came from). A report holding fewer ranks
    than its run had (one node's of a job of several: run.processes, from the metrics' world size) is the
    job's step: every rank steps together, so its own count is the job's."""
    split, micro_from = pipeline_of(split_of(summary), summary.run)
    run = summary.run
    if run and run.processes > split.processes:
        devices = max(split.devices, run.processes) if split.gpu else run.processes  # a rank per GPU past one node
        split = dataclasses.replace(split, processes=run.processes, devices=devices)
    return split, micro_from


def machine_read(machine: Machine | None) -> Machine:
    """The machine block, an empty one (nothing read) where the summary has none."""
    return machine or Machine()
