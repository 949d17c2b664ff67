"""The run's configuration: parsed once, validated once, frozen, passed down.

Per-rank values (rank, device, ...) are filled in with `dataclasses.replace` by the
mode's process setup; nothing mutates a config after it is built.
"""
import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping, Optional

from ..runtime.errors import UserError, need
from .capture import check_profile_epochs
from .mode import Mode

PP_SCHEDULES = ("gpipe", "1f1b")  # --mode pp; handler/PP/schedule.py
DALI_SOURCES = ("memory", "raw", "jpeg")  # what --mode ddp_dali reads; handler/DALI/cifar10_loader.py
COMM_HOOKS = ("allreduce", "fp16", "bf16", "powersgd")  # DDP's gradient exchange; handler/DDP/comm_hook.py
CPU_DEFAULT_PROCS = 2


@dataclass(frozen=True, kw_only=True)
class Config:
    mode: str = "ddp"
    num_gpu: int = 0  # devices (GPU runs) or worker processes (CPU runs), resolved
    data: str = "./data"
    dataset: str = "auto"
    synthetic_train: int = 10000
    synthetic_test: int = 2000
    ckpt: str = "./ckpt"
    save: str = "ckpt"
    resume: Optional[str] = None
    overwrite: bool = False
    nan_patience: int = 20
    epochs: int = 30
    stop_after: int = 0
    batch_size: int = 256
    model: str = "resnet18"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    workers: int = 2
    valid_size: int = 5000
    cutout: int = 0
    metrics: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    dist_timeout: float = 120.0
    progress: bool = True
    amp: str = "off"
    channels_last: bool = False
    accum_steps: int = 1
    activation_checkpointing: bool = False
    sync_bn: bool = False
    dp_balanced: bool = False
    dali_source: str = ""  # "" = $HARNESS_DALI_SOURCE or the measured default
    pp_schedule: str = "1f1b"
    pp_split: str = "time"
    microbatches: int = 4
    comm_hook: str = "allreduce"
    powersgd_rank: int = 2
    powersgd_warmup: int = 10
    bucket_cap_mb: float = 25.0
    static_graph: bool = False
    grad_as_bucket_view: bool = False
    profile_epochs: str = ""  # "" = the default window (handler/train/capture.py), "all", or "A:B"
    # Filled per process by the mode's setup.
    use_cuda: bool = False
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: str = "cpu"
    backend: str = "none"
    # Set by prepare_dataset (handler/data/dataset.py) where the data is prepared: why
    # --dataset auto ran synthetic data, "" when it ran what was asked (docs/METRICS.md).
    dataset_fallback: str = ""

    @property
    def local_batch(self) -> int:
        if self.mode == "pp":  # every stage sees the whole batch, as micro-batches
            return self.batch_size
        return self.batch_size // self.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dataset_dir(self) -> str:
        """Folder holding cifar-10-batches-py for this run's dataset choice."""
        if self.dataset == "synthetic":
            name = f"synthetic_{self.synthetic_train}x{self.synthetic_test}"
            return os.path.join(self.data, name)
        return self.data

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + error
        raise UserError(f"{message} (see --help)")


def build_parser(modes) -> argparse.ArgumentParser:
    d = Config()
    p = _Parser(prog="train_cifar.py",
                description="Train a CNN on CIFAR-10 with DataParallel, DDP, DDP+DALI, FSDP or a pipeline.")
    p.add_argument("--mode", choices=modes, default=d.mode, help="parallel strategy")
    p.add_argument("--num_gpu", "--num-gpu", dest="num_gpu", type=int, default=None,
                   help="devices / worker processes (default: all visible GPUs; "
                        f"without GPUs, {CPU_DEFAULT_PROCS} CPU processes for DDP modes)")
    p.add_argument("--data", default=d.data, help="dataset root holding cifar-10-batches-py")
    p.add_argument("--dataset", choices=("auto", "cifar10", "synthetic"), default=d.dataset,
                   help="cifar10 (download if absent), synthetic, or auto: cifar10 if "
                        "present or downloadable, else synthetic")
    p.add_argument("--synthetic-train", type=int, default=d.synthetic_train,
                   help="training images in a generated synthetic dataset")
    p.add_argument("--synthetic-test", type=int, default=d.synthetic_test,
                   help="test images in a generated synthetic dataset")
    p.add_argument("--ckpt", default=d.ckpt, help="checkpoint directory")
    p.add_argument("--save", choices=("ckpt", "none"), default=d.save,
                   help="save last.pt/best.pt every epoch, or nothing")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="PATH",
                   help="resume from PATH, or from CKPT/last.pt when no path is given")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh even though --ckpt holds an earlier run's last.pt, replacing it")
    p.add_argument("--nan-patience", type=int, default=d.nan_patience, metavar="N",
                   help="with --amp fp16, stop after N non-finite losses in a row (GradScaler skips "
                        "some steps on purpose); other runs stop at the first one")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--stop-after", type=int, default=d.stop_after, metavar="N",
                   help="end this run after N more epochs, keeping the --epochs schedule "
                        "(for time-boxed jobs; continue later with --resume)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="GLOBAL batch size; each of W processes gets batch/W")
    p.add_argument("--model", default=d.model, help="resnet18 (default) or resnet20, see models/")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (SGD, cosine)")
    p.add_argument("--momentum", type=float, default=d.momentum)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--workers", type=int, default=d.workers,
                   help="DataLoader workers or DALI threads per process")
    p.add_argument("--valid-size", type=int, default=d.valid_size,
                   help="training images held out for validation (0 = none)")
    p.add_argument("--cutout", type=int, default=d.cutout, help="cutout size in pixels (0 = off)")
    p.add_argument("--metrics", default=d.metrics,
                   help="metrics JSON path (default CKPT/metrics.json)")
    p.add_argument("--host", default=d.host, help="rendezvous address for spawned runs")
    p.add_argument("--port", type=int, default=d.port, help="rendezvous port (default: a free one)")
    p.add_argument("--dist-timeout", type=float, default=d.dist_timeout,
                   help="seconds a rank waits for a missing peer before failing")
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default=d.amp,
                   help="mixed precision: bf16 autocast, or fp16 autocast with GradScaler (GPU)")
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format")
    p.add_argument("--accum-steps", type=int, default=d.accum_steps,
                   help="split each batch into K micro-batches (gradient accumulation)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each ResNet stage's activations in backward (less memory)")
    p.add_argument("--sync-bn", action="store_true",
                   help="SyncBatchNorm across ranks (DDP modes, GPU only)")
    p.add_argument("--dp-balanced", action="store_true",
                   help="dp: compute the loss inside each replica instead of gathering logits on GPU 0")
    p.add_argument("--dali-source", choices=DALI_SOURCES, default=None,
                   help="ddp_dali input: the arrays in memory (default, fastest measured), one raw "
                        "uint8 file per image, or JPEG files decoded by DALI (on the GPU with device=mixed)")
    p.add_argument("--pp-schedule", choices=PP_SCHEDULES, default=d.pp_schedule,
                   help="pp: GPipe (all forwards, then all backwards) or 1F1B (a backward as soon as "
                        "possible, so fewer micro-batches' activations are alive at once)")
    p.add_argument("--pp-split", choices=("params", "time"), default=d.pp_split,
                   help="pp: cut the model where parameters balance, or where measured forward+backward "
                        "time per block balances (timed once, cached in CKPT/pp_timing.json)")
    p.add_argument("--microbatches", type=int, default=d.microbatches, metavar="M",
                   help="pp: micro-batches per global batch; the pipeline bubble is (W-1)/(M+W-1)")
    p.add_argument("--comm-hook", choices=COMM_HOOKS, default=d.comm_hook,
                   help="ddp/ddp_dali gradient exchange: plain all-reduce, fp16 or bf16 compression, or "
                        "PowerSGD low-rank compression (docs/COMM.md)")
    p.add_argument("--powersgd-rank", type=int, default=d.powersgd_rank, metavar="R",
                   help="PowerSGD: rank of each gradient's approximation (higher: more bytes, closer to exact)")
    p.add_argument("--powersgd-warmup", type=int, default=d.powersgd_warmup, metavar="N",
                   help="PowerSGD: steps of plain all-reduce before compression starts (at least 2)")
    p.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb, metavar="MB",
                   help="DDP gradient bucket size: smaller buckets start communicating earlier in backward")
    p.add_argument("--static-graph", action="store_true",
                   help="DDP static_graph: the same parameters get gradients every step")
    p.add_argument("--grad-as-bucket-view", action="store_true",
                   help="DDP gradient_as_bucket_view: gradients live in the buckets (one copy less)")
    p.add_argument("--profile-epochs", default=d.profile_epochs, metavar="A:B",
                   help="under nsys, capture only epochs A..B (0-based, inclusive), or `all`; default: "
                        "epochs 1:2 for runs of more than 3 epochs, else all (docs/PROFILING.md)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (logs stay one line per epoch)")
    return p


def parse_config(argv, modes: Mapping[str, Mode], *, cuda_count: Optional[int] = None) -> Config:
    """Parse and validate the command line into a Config with num_gpu resolved; modes are
    handler/modes.py's, by name."""
    ns = build_parser(tuple(modes)).parse_args(argv)
    fields = {f.name for f in dataclasses.fields(Config)}
    values = {k: v for k, v in vars(ns).items() if k in fields and v is not None}
    if cuda_count is None:
        from ..runtime.devices import cuda_status
        cuda_count = cuda_status()[0]
    values["use_cuda"] = cuda_count > 0
    from ..runtime.dist import torchrun_world
    torchrun = torchrun_world() if ns.mode != "dp" else None
    values["num_gpu"] = (_torchrun_num_gpu(ns.num_gpu, torchrun) if torchrun
                         else _resolve_num_gpu(ns.num_gpu, ns.mode, cuda_count))
    # DP is one process driving num_gpu devices; the DDP modes are one process per device,
    # as many as torchrun started when it did (docs/MULTINODE.md).
    values["world_size"] = 1 if ns.mode == "dp" else (torchrun or values["num_gpu"])
    if not values["metrics"]:
        values["metrics"] = os.path.join(ns.ckpt, "metrics.json")
    cfg = Config(**values)
    validate(cfg, modes)
    return cfg


def _torchrun_num_gpu(requested: Optional[int], world: int) -> int:
    """Under torchrun its WORLD_SIZE is the world; --num_gpu, when given, must say the same.
    The devices this node uses are its LOCAL_WORLD_SIZE."""
    if requested is not None and requested != world:
        raise UserError(f"--num_gpu {requested} but torchrun started {world} processes (WORLD_SIZE); "
                        f"drop --num_gpu or use --num_gpu {world}")
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def _resolve_num_gpu(requested: Optional[int], mode: str, cuda_count: int) -> int:
    if requested is not None and requested < 1:
        raise UserError(f"--num_gpu {requested} is not a positive count; use 1 or more")
    if cuda_count:
        if requested is not None and requested > cuda_count:
            raise UserError(f"--num_gpu {requested} but only {cuda_count} GPU(s) are visible; "
                            f"use --num_gpu 1..{cuda_count} or set CUDA_VISIBLE_DEVICES")
        return requested or cuda_count
    if mode == "dp":
        return 1
    return requested or CPU_DEFAULT_PROCS


def validate(cfg: Config, modes: Mapping[str, Mode]) -> None:
    """Check everything that can be checked before any process starts; the mode's own
    rules (modes[cfg.mode].check) come last."""
    mode = modes[cfg.mode]
    need(cfg.epochs >= 1, f"--epochs {cfg.epochs}: train for at least 1 epoch")
    need(cfg.stop_after >= 0, f"--stop-after {cfg.stop_after}: use 0 (off) or a positive epoch count")
    need(cfg.batch_size >= 1, f"--batch-size {cfg.batch_size}: use a positive batch size")
    parts = {"dp": cfg.num_gpu, "pp": 1}.get(cfg.mode, cfg.world_size)
    need(cfg.batch_size % parts == 0,
         f"--batch-size {cfg.batch_size} is the global batch and must split evenly over "
         f"{parts} {'GPUs' if cfg.use_cuda else 'processes'}; use a multiple of {parts}")
    need(cfg.batch_size // parts >= 2,
         f"--batch-size {cfg.batch_size} gives {cfg.batch_size // parts} image per "
         f"{'GPU' if cfg.use_cuda else 'process'}; BatchNorm needs at least 2: use --batch-size {2 * parts} or more")
    need(cfg.lr > 0, f"--lr {cfg.lr}: the learning rate must be positive")
    need(cfg.workers >= 0, f"--workers {cfg.workers}: use 0 or more")
    need(cfg.valid_size >= 0, f"--valid-size {cfg.valid_size}: use 0 (none) or more")
    need(0 <= cfg.cutout <= 32, f"--cutout {cfg.cutout}: use 0 (off) to 32 pixels")
    need(cfg.synthetic_train >= 10 and cfg.synthetic_test >= 1,
         "--synthetic-train needs at least 10 images and --synthetic-test at least 1")
    need(cfg.accum_steps >= 1 and cfg.local_batch % cfg.accum_steps == 0,
         f"--accum-steps {cfg.accum_steps} must divide the per-process batch {cfg.local_batch}")
    need(cfg.amp != "fp16" or cfg.use_cuda, "--amp fp16 needs a GPU; use --amp bf16 on CPU")
    need(not cfg.sync_bn or mode.sync_bn,
         f"--sync-bn synchronises BatchNorm across DDP ranks; use it with --mode "
         f"{' or '.join(name for name, m in modes.items() if m.sync_bn)}, not {cfg.mode}" + mode.sync_bn_refusal)
    need(not cfg.sync_bn or cfg.use_cuda,
         "--sync-bn needs GPUs: torch's SyncBatchNorm runs on CUDA only; drop --sync-bn on CPU")
    need(not cfg.dp_balanced or cfg.mode == "dp", "--dp-balanced changes DataParallel; use it with --mode dp")
    need(not cfg.dali_source or cfg.mode == "ddp_dali",
         f"--dali-source picks ddp_dali's input files; use it with --mode ddp_dali, or drop it for --mode {cfg.mode}")
    shaped = changed_options(cfg, (("--pp-schedule", "pp_schedule"), ("--microbatches", "microbatches"),
                                    ("--pp-split", "pp_split")))
    need(not shaped or cfg.mode == "pp",
         f"{' '.join(shaped)} shape{'s' if len(shaped) == 1 else ''} the pipeline of --mode pp; use --mode pp, "
         f"or drop {'it' if len(shaped) == 1 else 'them'} for --mode {cfg.mode}")
    changed = changed_comm_options(cfg)
    need(not changed or mode.comm_hooks,
         f"{' '.join(changed)} tune{'s' if len(changed) == 1 else ''} DDP's gradient all-reduce; use --mode "
         f"{' or '.join(name for name, m in modes.items() if m.comm_hooks)}, or drop "
         f"{'it' if len(changed) == 1 else 'them'} for --mode {cfg.mode}")
    check_profile_epochs(cfg.profile_epochs, cfg.epochs)
    need(cfg.nan_patience >= 1, f"--nan-patience {cfg.nan_patience}: use 1 or more steps")
    need(not (cfg.overwrite and cfg.resume is not None),
         "--overwrite starts afresh and --resume continues: pass one of them")
    need(cfg.dist_timeout > 0, "--dist-timeout must be positive seconds")
    need(0 <= cfg.port < 65536, f"--port {cfg.port}: use 1..65535, or 0 for a free port")
    from models import MODELS
    need(cfg.model in MODELS, f"--model {cfg.model!r} is unknown; choose one of: "
                              f"{', '.join(sorted(MODELS))}")
    mode.check(cfg)


def changed_options(cfg: Config, flags) -> list:
    """The (flag, field) pairs' flags whose values differ from the defaults."""
    d = Config()
    return [flag for flag, name in flags if getattr(cfg, name) != getattr(d, name)]


def changed_comm_options(cfg: Config) -> list:
    """The DDP communication flags (docs/COMM.md) that differ from their defaults."""
    return changed_options(cfg, (("--comm-hook", "comm_hook"), ("--powersgd-rank", "powersgd_rank"),
                                 ("--powersgd-warmup", "powersgd_warmup"), ("--bucket-cap-mb", "bucket_cap_mb"),
                                 ("--static-graph", "static_graph"), ("--grad-as-bucket-view", "grad_as_bucket_view")))
