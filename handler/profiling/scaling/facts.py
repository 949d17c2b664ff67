"""The run's own facts a prediction reads, each with where it came from: the summary's `run` block
(mode, model, gradients, nodes, GPUs per node, pp's micro-batches; docs/summary.schema.json) and
the machine block's `rank_cores`. An older summary without them is read as before (the report's
shape, its file name, the model's table, the host's cores), and the first line says so.
"""
import dataclasses
import math
from pathlib import Path

from handler.runtime.errors import UserError

from .step import Split

RESNET18_GRAD_MB = 44.696  # fp32 gradients of ResNet-18 (models/, checked by a test): the lab's model
# MB of fp32 gradients each model of models/ all-reduces per step (a test counts them); read here,
# not counted, so the what-if needs no torch. A model not listed is taken as ResNet-18, and said so.
GRAD_MB = {"resnet18": RESNET18_GRAD_MB, "resnet20": 1.079, "fastnet": 12.416}
MODES = ("dp", "ddp", "ddp_dali", "fsdp", "pp")


# run fields read as counts, and the least each may be (docs/summary.schema.json)
COUNTS = {"nodes": 1, "gpus_per_node": 0, "processes": 1, "pp_stages": 1, "pp_microbatches": 1}


def run_of(summary: dict) -> dict:
    """The run block, each count a whole number and grad_mb a size, else one line naming the field."""
    run = summary.get("run") or {}
    for key, least in COUNTS.items():
        value = run.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and float(value).is_integer() and least <= value < 1e6):
            raise UserError(f"run.{key} is {value!r}, not a whole number >= {least}; pass the .summary.json that "
                            "python -m handler.profiling.report wrote, unedited, or summarise the report again")
    grad = run.get("grad_mb")
    if grad is not None and not (isinstance(grad, (int, float)) and not isinstance(grad, bool) and 0 < grad < 1e9):
        raise UserError(f"run.grad_mb is {grad!r}, not a size in MB (> 0); pass the .summary.json that "
                        "python -m handler.profiling.report wrote, unedited, or summarise the report again")
    return run


def mode_name(text: str | None) -> str | None:
    """A harness mode from a mode or a label (compare's `dp+amp [fp16]` is dp); None if it names none."""
    name = (text or "").split()[0].split("+")[0] if (text or "").strip() else ""
    return name if name in MODES else None


def harness_mode(summary: dict, split: Split, given: str | None = None) -> tuple[str, str]:
    """(mode, where it came from): the run's recorded mode, else the caller's (the lab page's row,
    compare's cell), else the report's shape (one process driving several GPUs: dp; stages: pp),
    else the file or folder name, the last resort; else ddp, assumed."""
    run = run_of(summary)
    if mode_name(run.get("mode")):
        return mode_name(run["mode"]) or "ddp", f"run.mode ({run.get('mode_from') or 'recorded'})"
    for text, source in ((given, "the page's cell"), (summary.get("run_mode"), "the page's cell")):
        if mode_name(text):
            return mode_name(text) or "ddp", source
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


def _named(summary: dict, mode: str) -> bool:
    """Whether the report's file or folder is named for `mode` (mode, mode_..., mode.xxx, compare's mode-n2)."""
    report = summary.get("report") or ""
    parts = Path(report[0] if isinstance(report, list) else report).parts[-2:]
    return any(p == mode or p.startswith((f"{mode}_", f"{mode}.", f"{mode}-")) for p in parts)


def gradients(summary: dict, given: float | None = None) -> tuple[float, str, str | None]:
    """(MB of fp32 gradients a step, where from, the model): --grad-mb, else the run's own
    (run.grad_mb), else its model's (GRAD_MB), else ResNet-18's, assumed."""
    run = run_of(summary)
    model = run.get("model") or summary.get("model")
    if given:
        return given, "--grad-mb", model
    if run.get("grad_mb"):  # the table's size by the model's name is said as before; a counted one says so
        source = run.get("grad_mb_from") or "recorded"
        said = f"{model}'s gradients" if source.startswith("whatif.GRAD_MB") and model else f"run.grad_mb ({source})"
        return float(run["grad_mb"]), said, model
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

    def says(self, between) -> str:
        """The nodes and the link between them, for the first line; "" where every count is on one node."""
        if not self.per_node:
            return ""
        said = (f"; {self.nodes} node{'s' * (self.nodes > 1)} of {self.per_node} ({self.from_}): counts past "
                f"{self.per_node} span nodes")
        rate = "unbounded" if math.isinf(between.gbit) else f"{between.gbit:.3g} Gbit/s" if between else ""
        return said + (f", their ring bound by the link between nodes, {rate} ({between.source})" if between else "")


def nodes_of(summary: dict, split: Split, per_node: int = 0) -> Nodes:
    """per_node: GPUs per node of a --link job of several nodes, where this report ran on one."""
    run = run_of(summary)
    nodes = int(run.get("nodes") or 1)
    devices = split.devices if split.gpu else split.processes
    if nodes > 1:
        per = int(run.get("gpus_per_node") or 0) if split.gpu else 0
        return Nodes(nodes, per or -(-devices // nodes), "run.nodes")
    if per_node:
        return Nodes(1, per_node, "as many GPUs per node as the --link job's nodes held")
    return Nodes(1, 0, "run.nodes" if run.get("nodes") else "one node (the run recorded no nodes)")


def gpus_read(split: Split, summary: dict) -> None:
    """A run that recorded GPUs (run.gpus_per_node) but whose summary holds no GPU's busy time would be
    predicted as CPU processes: one line instead."""
    per_node = run_of(summary).get("gpus_per_node")
    if per_node and not split.gpu:
        raise UserError(f"the run ran on GPUs (run.gpus_per_node {per_node}) but its summary holds no GPU's busy "
                        "time (`gpus`), so it would be predicted as CPU processes; profile with CUDA traced "
                        "(nsys --trace cuda,nvtx) and summarise the report again")


def pipeline_of(split: Split, summary: dict) -> tuple[Split, str | None]:
    """pp's micro-batches: run.pp_microbatches, else what the report read (step._pipeline says how)."""
    run = run_of(summary)
    if not split.pipeline:
        return split, None
    if run.get("pp_microbatches"):
        pipe = {**split.pipeline, "microbatches": int(run["pp_microbatches"]),
                "stages": int(run.get("pp_stages") or split.pipeline["stages"])}
        return dataclasses.replace(split, pipeline=pipe), f"run.pp_microbatches ({run.get('pp_from') or 'recorded'})"
    return split, split.pipeline.get("from")


def machine_read(machine: dict) -> dict:
    """The machine block with the ranks' cores in place of the host's where the run recorded them
    (a run pinned to 2 of 18 cores had 2)."""
    if machine.get("rank_cores"):
        return {**machine, "host_cores": machine.get("cpu_cores"), "cpu_cores": machine["rank_cores"],
                "cpu_cores_from": f"the ranks' cores, {machine.get('rank_cores_from') or 'recorded'}"}
    return machine
