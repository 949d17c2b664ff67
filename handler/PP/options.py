"""--mode pp's own options and their rules, checked with the shared ones before any process starts."""
from dataclasses import dataclass

from ..runtime.errors import need
from ..train.options import Options, at_least, option

PP_SCHEDULES = ("gpipe", "1f1b")  # handler/PP/schedule.py


@dataclass(frozen=True, kw_only=True)
class PipelineOptions(Options):
    """The pipeline's shape: its schedule, where the model is cut into stages, and how many
    micro-batches flow through it. The bubble (W-1)/(M+W-1) depends on M, the balance on the cut
    (docs/MODES.md#pipeline-parallelism-pp)."""
    TITLE = "pp pipeline (docs/MODES.md)"
    REFUSAL = "{flags} shape{s} the pipeline of --mode {owners}; use --mode {owners}, or drop {it} for --mode {mode}"
    pp_schedule: str = option("1f1b", choices=PP_SCHEDULES,
                              help="pp: GPipe (all forwards, then all backwards) or 1F1B (a backward as soon as "
                                   "possible, so fewer micro-batches' activations are alive at once)")
    pp_split: str = option("time", choices=("params", "time"),
                           help="pp: cut the model where parameters balance, or where measured forward+backward "
                                "time per block balances (timed once, cached in CKPT/pp_timing.json)")
    microbatches: int = option(4, metavar="M", within=at_least(1),
                               help="pp: micro-batches per global batch; the pipeline bubble is (W-1)/(M+W-1)")


def check_options(cfg) -> None:
    """W stages of the model, each on its own process, M micro-batches per batch."""
    from models import MODELS
    from .stages import blocks, model_stages
    pp = PipelineOptions.of(cfg)
    model = MODELS[cfg.model]()
    if pp.pp_split == "params":  # cut only between the model's own stages
        units, what = len(model_stages(model)), "stages"
    else:
        units, what = len(blocks(model)), "blocks"
    w, m = cfg.world_size, pp.microbatches
    need(cfg.batch_size % m == 0, f"--batch-size {cfg.batch_size} does not split into --microbatches {m} "
                                  f"equal micro-batches; use a multiple of {m}")
    need(cfg.batch_size // m >= 2, f"--batch-size {cfg.batch_size} in {m} micro-batches gives "
                                   f"{cfg.batch_size // m} image each; BatchNorm needs at least 2")
    need(w <= units, f"--num_gpu {w} pipeline stages but {cfg.model} has {units} {what} to split "
                     f"(--pp-split {pp.pp_split}); use --num_gpu 1..{units}")
    need(pp.pp_schedule != "1f1b" or m >= w, f"--pp-schedule 1f1b needs at least one micro-batch per "
                                              f"stage: use --microbatches {w} or more, or --pp-schedule gpipe")
    need(cfg.accum_steps == 1, "--accum-steps with --mode pp: the pipeline already accumulates its "
                               "micro-batches; use --microbatches instead")
    need(cfg.amp != "fp16", "--amp fp16 with --mode pp: the schedule runs backward itself, so GradScaler "
                            "cannot scale its loss; use --amp bf16")
