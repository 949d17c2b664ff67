"""The run's configuration: parsed once, validated once, frozen, passed down.

Options come in sections (handler/train/options.py), each field written once with its
default and help; the command line is generated from them (docs/CLI.md). The shared sections
are below and their fields are read flat (`cfg.epochs`); a mode package with options of its
own declares its section, reads it with `Section.of(cfg)`, and checks it (its Mode's check).
"""
import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Type, TypeVar

from ..data.cifar_images import cache_root
from ..data.dataset import DEFAULT_DATA, DEFAULT_VALID, named
from ..runtime.errors import UserError, need
from .capture import check_profile_epochs
from .mode import Mode
from .options import (Options, Range, above, add_section, at_least, changed, flat, option, out_of_range, refusal,
                      section_values, unique)

CPU_DEFAULT_PROCS = 2
S = TypeVar("S", bound=Options)


@dataclass(frozen=True, kw_only=True)
class RunOptions(Options):
    TITLE = "run"
    mode: str = option("ddp", help="parallel strategy")
    num_gpu: int = option(0, "--num_gpu", "--num-gpu", cli_default=None,
                          help="devices / worker processes (default: all visible GPUs; "
                               f"without GPUs, {CPU_DEFAULT_PROCS} CPU processes for DDP modes)")
    ckpt: str = option("./ckpt", help="checkpoint directory")
    save: str = option("ckpt", choices=("ckpt", "none"), help="save last.pt/best.pt every epoch, or nothing")
    save_ckpt: bool = option(False, "--save_ckpt", help="the course kit's flag: saving is our default "
                                                      "(--save ckpt), so it changes nothing; refused with --save none")
    resume: Optional[str] = option(None, nargs="?", const="", metavar="PATH",
                                   help="resume from PATH, or from CKPT/last.pt when no path is given")
    overwrite: bool = option(False, help="start afresh even though --ckpt holds an earlier run's last.pt, "
                                         "replacing it")
    nan_patience: int = option(20, metavar="N", within=at_least(1, "use 1 or more steps"),
                               help="with --amp fp16, stop after N non-finite losses in a row (GradScaler skips "
                                    "some steps on purpose); other runs stop at the first one")
    seed: int = option(0, within=at_least(0, "use a seed of 0 or more"))
    metrics: str = option("", help="metrics JSON path (default CKPT/metrics.json)")
    host: str = option("127.0.0.1", "--host", "--ip", help="rendezvous address for spawned runs (--ip: the kit's name)")
    port: int = option(0, within=Range(0, 65535, fix="use 1..65535, or 0 for a free port"),
                       help="rendezvous port (default: a free one)")
    dist_timeout: float = option(120.0, within=above(0, "use a positive number of seconds"), help="seconds a rank waits for a missing peer before failing")
    progress: bool = option(True, "--no-progress", action="store_false",
                            help="no progress bars (logs stay one line per epoch)")


@dataclass(frozen=True, kw_only=True)
class DataOptions(Options):
    TITLE = "data"
    data: str = option(DEFAULT_DATA, help="dataset root: torchvision's folder (holding cifar-10-batches-py) or the "
                                          "course kit's PNG tree (DATA/train/<class>/<n>.png; docs/LAB.md)")
    dataset: str = option("auto", choices=("auto", "cifar10", "synthetic"),
                          help="cifar10 (download if absent), synthetic, or auto: cifar10 if "
                               "present or downloadable, else synthetic")
    synthetic_train: int = option(10000, within=at_least(10), help="training images in a generated synthetic dataset")
    synthetic_test: int = option(2000, within=at_least(1), help="test images in a generated synthetic dataset")
    batch_size: int = option(256, within=at_least(1, "use a positive batch size"), help="GLOBAL batch size; each of W processes gets batch/W")
    workers: int = option(2, within=at_least(0), help="DataLoader workers or DALI threads per process")
    valid_size: Optional[int] = option(None, type=int, metavar="N", within=at_least(0, "use 0 (none) or more"),
                                       help=f"training images held out for validation (0 = none; default {DEFAULT_VALID}, "
                                            "or a tenth of a training set too small for it; the run's metrics "
                                            "record the number held out)")
    cutout: int = option(0, within=Range(0, 32, fix="use 0 (off) to 32 pixels"), help="cutout size in pixels (0 = off)")


@dataclass(frozen=True, kw_only=True)
class OptimOptions(Options):
    TITLE = "optimisation"
    model: str = option("resnet18", help="resnet18 (default), resnet20 or fastnet, see models/")
    epochs: int = option(30, within=at_least(1, "train for at least 1 epoch"))
    stop_after: int = option(0, metavar="N", within=at_least(0, "use 0 (off) or a positive epoch count"),
                             help="end this run after N more epochs, keeping the --epochs schedule "
                                  "(for time-boxed jobs; continue later with --resume)")
    lr: float = option(0.1, within=above(0, "the learning rate must be a positive finite number"), help="peak learning rate (SGD, cosine)")
    momentum: float = option(0.9, within=Range(0, 1, high_open=True))
    weight_decay: float = option(5e-4, "--weight-decay", "--decay", within=at_least(0),
                                 help="SGD weight decay (--decay: the kit's name)")
    amp: str = option("off", choices=("off", "bf16", "fp16"),
                      help="mixed precision: bf16 autocast, or fp16 autocast with GradScaler (GPU)")
    channels_last: bool = option(False, help="NHWC memory format")
    accum_steps: int = option(1, within=at_least(1), help="split each batch into K micro-batches (gradient accumulation)")
    activation_checkpointing: bool = option(False, help="recompute each ResNet stage's activations in "
                                                        "backward (less memory)")
    sync_bn: bool = option(False, help="SyncBatchNorm across ranks (DDP modes, GPU only)")


@dataclass(frozen=True, kw_only=True)
class ProfilingOptions(Options):
    TITLE = "profiling"
    profile_epochs: str = option("", metavar="A:B",
                                 help="under nsys, capture only epochs A..B (0-based, inclusive), or `all`; "
                                      "default: epochs 1:2 for runs of more than 3 epochs, else all "
                                      "(docs/PROFILING.md)")


SHARED_SECTIONS = (RunOptions, DataOptions, OptimOptions, ProfilingOptions)


@dataclass(frozen=True, kw_only=True)
class Config(RunOptions, DataOptions, OptimOptions, ProfilingOptions):
    """One run: the shared sections' options (read flat), what parse_config resolves, what each
    process fills in, and the mode packages' sections (read with `Section.of(cfg)`)."""
    # Resolved once by parse_config, from the machine, the launcher and the mode:
    use_cuda: bool = False
    world_size: int = 1
    batch_split: bool = True  # False: every rank sees the whole batch (Mode.whole_batch; pp's stages)
    # Filled per process by the mode's setup (dataclasses.replace):
    rank: int = 0
    local_rank: int = 0
    device: str = "cpu"
    backend: str = "none"
    # Set by prepare_dataset (handler/data/dataset.py) where the data is prepared: why
    # --dataset auto ran synthetic data, "" when it ran what was asked; the metrics record it
    # as env.dataset_fallback, not in `config`, which holds options (docs/METRICS.md).
    dataset_fallback: str = ""
    # The mode packages' own sections (Mode.options), every mode's, so the metrics hold them all.
    sections: tuple = ()

    @property
    def local_batch(self) -> int:
        return self.batch_size // self.world_size if self.batch_split else self.batch_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dataset_dir(self) -> str:
        """Folder holding cifar-10-batches-py for this run's dataset choice."""
        if self.dataset == "synthetic":
            name = f"synthetic_{self.synthetic_train}x{self.synthetic_test}"
            # A fallback nobody asked for never lands in a folder the user named.
            return os.path.join(cache_root() if self.dataset_fallback and named(self.data) else self.data, name)
        return self.data

    def section(self, kind: Type[S]) -> S:
        """A mode package's section; its defaults where this Config was built without it."""
        return next((s for s in self.sections if isinstance(s, kind)), None) or kind()

    def with_section(self, options: Options) -> "Config":
        kept = tuple(s for s in self.sections if type(s) is not type(options))
        return dataclasses.replace(self, sections=(*kept, options))

    def as_dict(self) -> dict:
        """The flat option names the metrics' `config` has always had (docs/METRICS.md)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("sections", "batch_split", "dataset_fallback", "save_ckpt")}
        return {**own, **flat(self.sections)}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):  # a prefix (--epoch) is named, never read as --epochs
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):  # one line instead of usage + error
        raise UserError(f"{message} (see --help)")


def mode_sections(modes: Mapping[str, Mode]) -> list:
    """Every mode's own sections, each once, in the order handler/modes.py lists the modes."""
    return unique(s for m in modes.values() for s in m.options)


def build_parser(modes: Mapping[str, Mode]) -> argparse.ArgumentParser:
    """The command line, generated from the shared sections and every mode's own."""
    p = _Parser(prog="train_cifar.py",
                description="Train a CNN on CIFAR-10 with DataParallel, DDP, DDP+DALI, FSDP or a pipeline.")
    for section in (*SHARED_SECTIONS, *mode_sections(modes)):
        add_section(p, section, {"mode": {"choices": tuple(modes)}})
    return p


def parse_config(argv, modes: Mapping[str, Mode], *, cuda_count: Optional[int] = None) -> Config:
    """Parse and validate the command line into a Config with num_gpu resolved; modes are
    handler/modes.py's, by name."""
    ns = vars(build_parser(modes).parse_args(argv))
    mode = modes[ns["mode"]]
    values: dict[str, Any] = {k: v for k, v in section_values(Config, ns).items() if v is not None}
    if cuda_count is None:
        from ..runtime.devices import cuda_status
        cuda_count = cuda_status()[0]
    values["use_cuda"] = cuda_count > 0
    from ..runtime.dist import torchrun_world
    torchrun = None if mode.one_process else torchrun_world()
    values["num_gpu"] = (_torchrun_num_gpu(ns["num_gpu"], torchrun, cuda_count) if torchrun
                         else _resolve_num_gpu(ns["num_gpu"], mode.one_process, cuda_count))
    # DP is one process driving num_gpu devices; the DDP modes are one process per device,
    # as many as torchrun started when it did (docs/MULTINODE.md).
    values["world_size"] = 1 if mode.one_process else (torchrun or values["num_gpu"])
    values["batch_split"] = not mode.whole_batch
    if not values["metrics"]:
        values["metrics"] = os.path.join(ns["ckpt"], "metrics.json")
    values["sections"] = tuple(s(**section_values(s, ns)) for s in mode_sections(modes))
    cfg = Config(**values)
    validate(cfg, modes)
    return cfg


def _torchrun_num_gpu(requested: Optional[int], world: int, cuda_count: int) -> int:
    """Under torchrun its WORLD_SIZE is the world; --num_gpu, when given, must say the same.
    The devices this node uses are its LOCAL_WORLD_SIZE: more than the visible GPUs stops every
    worker in one line here, before any check asks for a GPU that is not there ("invalid device
    ordinal", a traceback from the bf16 check)."""
    if requested is not None and requested != world:
        raise UserError(f"--num_gpu {requested} but torchrun started {world} processes (WORLD_SIZE); "
                        f"drop --num_gpu or use --num_gpu {world}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if cuda_count and local_world > cuda_count:
        raise UserError(f"LOCAL_RANK {os.environ.get('LOCAL_RANK', '?')} of {local_world} processes on this node but "
                        f"only {cuda_count} GPU(s) are visible on this node; start at most {cuda_count} processes "
                        f"per node (torchrun --nproc_per_node {cuda_count}) or set CUDA_VISIBLE_DEVICES")
    return local_world


def _resolve_num_gpu(requested: Optional[int], one_process: bool, cuda_count: int) -> int:
    if requested is not None and requested < 1:
        raise UserError(f"--num_gpu {requested} is not a positive count; use 1 or more")
    if cuda_count:
        if requested is not None and requested > cuda_count:
            raise UserError(f"--num_gpu {requested} but only {cuda_count} GPU(s) are visible; "
                            f"use --num_gpu 1..{cuda_count} or set CUDA_VISIBLE_DEVICES")
        return requested or cuda_count
    if one_process:
        return 1
    return requested or CPU_DEFAULT_PROCS


def validate(cfg: Config, modes: Mapping[str, Mode]) -> None:
    """Check everything that can be checked before any process starts: the shared sections
    here, then the refusal of other modes' options, then the mode's own rules (Mode.check)."""
    mode = modes[cfg.mode]
    for options in (cfg, *cfg.sections):  # every numeric option, first: the rules below assume them in range
        bad = out_of_range(options)
        need(bad is None, str(bad))
    _check_batch(cfg, mode)
    need(cfg.local_batch % cfg.accum_steps == 0,
         f"--accum-steps {cfg.accum_steps} must divide the per-process batch {cfg.local_batch}")
    need(cfg.amp != "fp16" or cfg.use_cuda, "--amp fp16 needs a GPU; use --amp bf16 on CPU")
    need(not cfg.sync_bn or mode.sync_bn,
         f"--sync-bn synchronises BatchNorm across DDP ranks; use it with --mode "
         f"{' or '.join(name for name, m in modes.items() if m.sync_bn)}, not {cfg.mode}" + mode.sync_bn_refusal)
    need(not cfg.sync_bn or cfg.use_cuda,
         "--sync-bn needs GPUs: torch's SyncBatchNorm runs on CUDA only; drop --sync-bn on CPU")
    refuse_other_modes_options(cfg, modes)
    check_profile_epochs(cfg.profile_epochs, cfg.epochs)
    need(not (cfg.save_ckpt and cfg.save == "none"), "--save_ckpt saves checkpoints and --save none saves nothing: "
                                                     "pass one of them")
    need(not (cfg.overwrite and cfg.resume is not None),
         "--overwrite starts afresh and --resume continues: pass one of them")
    from models import MODELS
    need(cfg.model in MODELS, f"--model {cfg.model!r} is unknown; choose one of: "
                              f"{', '.join(sorted(MODELS))}")
    mode.check(cfg)
    _refuse_emulated_bf16(cfg, mode)


def _refuse_emulated_bf16(cfg: Config, mode: Mode) -> None:
    """--amp bf16 on GPUs without native bf16 (V100, T4) would time an emulation: stop, naming
    fp16, or off where the mode refuses fp16 too (its own rules decide)."""
    if cfg.amp != "bf16" or not cfg.use_cuda:
        return
    from ..runtime.precision.gpu import bf16_refusal
    refusal = bf16_refusal(cfg.num_gpu)  # the devices this node uses
    if refusal:
        try:
            mode.check(dataclasses.replace(cfg, amp="fp16"))
        except UserError:
            refusal = refusal.replace("use --amp fp16", f"use --amp off (--mode {cfg.mode} refuses fp16 too)")
        raise UserError(refusal)


def _check_batch(cfg: Config, mode: Mode) -> None:
    """The global batch splits evenly over the processes, or over DataParallel's devices."""
    parts = cfg.num_gpu if mode.one_process else (cfg.world_size if cfg.batch_split else 1)
    need(cfg.batch_size % parts == 0,
         f"--batch-size {cfg.batch_size} is the global batch and must split evenly over "
         f"{parts} {'GPUs' if cfg.use_cuda else 'processes'}; use a multiple of {parts}")
    need(cfg.batch_size // parts >= 2,
         f"--batch-size {cfg.batch_size} gives {cfg.batch_size // parts} image per "
         f"{'GPU' if cfg.use_cuda else 'process'}; BatchNorm needs at least 2: use --batch-size {2 * parts} or more")


def refuse_other_modes_options(cfg: Config, modes: Mapping[str, Mode]) -> None:
    """A mode's option given to a mode that lacks its section would change nothing: refuse it
    (at its default it is accepted, as it changes nothing either)."""
    own = modes[cfg.mode].options
    for section in mode_sections(modes):
        flags = changed(cfg.section(section))
        if flags and section not in own:
            owners: Sequence[str] = [name for name, m in modes.items() if section in m.options]
            raise UserError(refusal(section, flags, owners, cfg.mode))
