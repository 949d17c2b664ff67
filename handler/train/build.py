"""`build_run`: everything one training run needs, made once before its first epoch.

The model, its wrapper, the optimiser and schedule, the loaders, the state a --resume
restores, the evaluator, the capture window and rank 0's metrics file all land in one
`Run`, so that `fit` (trainer.py) only runs the epochs. The order below is the order every
rank must share: the seed before the model, and the collectives in the same sequence.
"""
import dataclasses
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Optional

import torch

from models import build_model
from ..data.dataset import load_splits
from ..data.loaders import Loaders
from ..runtime import dist, rank0
from ..runtime.cpu_memory import keep_freed_memory
from ..runtime.precision.cpu import bf16_note
from ..runtime.errors import UserError
from ..runtime.names import HOST, RANK
from ..runtime.nvtx import nvtx_mark, profiler_attached
from .capture import Capture, describe
from .checkpoint import ModelState, load_checkpoint, set_rng_state
from .config import Config
from .loop import Step, evaluate
from .metrics import MetricsFile, environment, model_facts
from .model_options import checkpoint_stages
from .optimizer import build_sgd, settle
from .strategy import Strategy

WARMUP_EPOCHS = 1


@dataclass(kw_only=True)
class Run:
    """One training run as built; as epochs pass only `best_acc` and `history` change."""
    cfg: Config
    device: torch.device
    raw: torch.nn.Module  # the unwrapped model: checkpoints hold its state_dict
    step: Step  # the wrapped model, optimiser, schedule, scaler and autocast the loop steps with
    state: ModelState  # how model and optimiser state enter checkpoints (Strategy.state)
    loaders: Loaders
    evaluate: Callable[..., dict]  # (loader, name) -> {"loss", "acc", "samples"}
    capture: Capture  # the profiler's capture window (docs/PROFILING.md, "Capture window")
    metrics: Optional[MetricsFile]  # rank 0's; None on the other ranks
    start_epoch: int  # the first epoch to train: 0, or where --resume continues
    start_step: int  # the step within start_epoch to continue at (a stopped run's)
    last_epoch: int  # one past the last epoch this run trains (--stop-after may end it early)
    started: float  # time.perf_counter() at the start, for total_time_s
    best_acc: float = -1.0  # the best validation accuracy so far; best.pt holds its weights
    history: list = field(default_factory=list)  # one record per epoch trained, resumed ones included


def resume_path(cfg) -> str:
    return cfg.resume or os.path.join(cfg.ckpt, "last.pt")


def warmup_cosine(optimizer, steps_per_epoch: int, epochs: int):
    total = max(steps_per_epoch * epochs, 1)
    warmup = min(steps_per_epoch * WARMUP_EPOCHS, total // 4)

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast_for(cfg, device):
    if cfg.amp == "off":
        return nullcontext
    return partial(torch.autocast, device.type, dtype=torch.bfloat16 if cfg.amp == "bf16" else torch.float16)


def build_run(cfg, strategy: Strategy) -> Run:
    device = _device(cfg)
    capture = Capture.start(cfg.profile_epochs, cfg.epochs)  # docs/PROFILING.md, "Capture window"
    nvtx_mark(RANK(cfg.rank))
    started = time.perf_counter()
    splits = load_splits(cfg)
    cfg = dataclasses.replace(cfg, valid_size=splits.valid_size)  # the hold-out applied, for the metrics
    for line in splits.notes:  # the data's warnings, and a hold-out --valid-size did not choose
        rank0.say(cfg, line, err=True)
    raw = _model(cfg, len(splits.classes), device)
    counted = model_facts(raw)  # before wrapping: FSDP shards the parameters, pp keeps a stage
    # Wrap first: FSDP replaces the parameters with shards, and the optimizer (and any
    # restored state) must see the ones that train. DDP and DP keep the same tensors.
    model = strategy.wrap(raw)
    optimizer, optimizer_note = build_sgd(cfg, raw.parameters(), device, scaler_enabled=cfg.amp == "fp16")
    loaders = _loaders(cfg, strategy, splits)
    scheduler = warmup_cosine(optimizer, len(loaders.train), cfg.epochs)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    start_epoch, start_step, best_acc, history, resume_notes = 0, 0, -1.0, [], ()
    if cfg.resume is not None:
        start_epoch, start_step, best_acc, history, resume_notes = _restore(
            cfg, strategy, len(splits.classes), raw=raw, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    settle(optimizer)
    step = Step(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                autocast=autocast_for(cfg, device), accum_steps=cfg.accum_steps,
                channels_last=cfg.channels_last, criterion=strategy.criterion, optimise=strategy.step)
    notes = strategy.notes + resume_notes + splits.notes + _fallbacks(cfg, device, optimizer_note)
    hosts = dist.hostnames()
    nvtx_mark(HOST(hosts[cfg.rank]))  # the profile report names each rank's host
    last_epoch = min(cfg.epochs, start_epoch + cfg.stop_after) if cfg.stop_after else cfg.epochs
    metrics = _metrics(cfg, strategy, model, capture, notes, hosts, history, range(start_epoch, last_epoch),
                       len(loaders.train), splits.left_out, counted)
    return Run(cfg=cfg, device=device, raw=raw, step=step, state=strategy.state, loaders=loaders,
               evaluate=_evaluator(cfg, strategy, raw, step, device), capture=capture, metrics=metrics,
               start_epoch=start_epoch, start_step=start_step, last_epoch=last_epoch, started=started,
               best_acc=best_acc, history=history)


def _device(cfg) -> torch.device:
    device = torch.device(cfg.device)
    if device.type == "cpu":
        keep_freed_memory()  # else glibc maps and zeroes every step's activations afresh
    # Fixed input shapes: cuDNN's autotuner picks the fastest kernels once and reuses them.
    torch.backends.cudnn.benchmark = device.type == "cuda"
    return device


def _loaders(cfg, strategy: Strategy, splits) -> Loaders:
    loaders = strategy.make_loaders(cfg, splits)
    if len(loaders.train) == 0:
        raise UserError(f"{len(splits.train[1])} training images give no full batch of {cfg.local_batch} "
                        "per process; use a smaller --batch-size or more data")
    return loaders


def _model(cfg, num_classes: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    raw = build_model(cfg.model, num_classes).to(device)
    if cfg.channels_last:
        raw = raw.to(memory_format=torch.channels_last)
    if cfg.activation_checkpointing:
        checkpoint_stages(raw)
    return raw


def _evaluator(cfg, strategy: Strategy, raw: torch.nn.Module, step: Step, device: torch.device) -> Callable[..., dict]:
    """(loader, name) -> results. The mode's own when it evaluates through its wrapper
    (pp: stage after stage); else the loop's, on the unwrapped model, after every rank
    takes rank 0's BatchNorm statistics (they stay rank-local in training)."""
    if strategy.evaluate:
        return partial(strategy.evaluate, step.model, device=device, autocast=step.autocast)
    return partial(_evaluate_replicas, raw, device=device, autocast=step.autocast,
                   channels_last=cfg.channels_last, lockstep=strategy.lockstep_eval)


def _evaluate_replicas(raw, loader, name: str, **options) -> dict:
    dist.broadcast_buffers(raw)
    return evaluate(raw, loader, name, **options)


def _fallbacks(cfg, device: torch.device, optimizer_note: Optional[str]) -> tuple:
    """Fallbacks taken while building, each printed once and recorded in the metrics."""
    notes = ()
    if optimizer_note:  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_with_every_flag_validate_accepts_for_it_on_gpus[fsdp-1]
        notes += (optimizer_note,)
        rank0.say(cfg, f"warning: {optimizer_note}", err=True)
    if cfg.amp == "bf16" and device.type == "cpu":
        note = bf16_note()
        if note:
            notes += (note,)
            rank0.say(cfg, f"warning: {note}", err=True)
    return notes


def _metrics(cfg, strategy: Strategy, model, capture: Capture, notes: tuple, hosts: dict, history: list,
             epochs: range, steps: int, left_out: dict, counted: dict) -> Optional[MetricsFile]:
    """Fit the capture window to the epochs this run trains, open rank 0's metrics file and
    say what runs (every rank must call it: its capture window is shared)."""
    capture.marks = (RANK(cfg.rank), HOST(hosts[cfg.rank]))
    capture_note = capture.fit_to(epochs.start, epochs.stop)
    if capture_note and profiler_attached():
        notes += (capture_note,)
        rank0.say(cfg, f"warning: {capture_note}", err=True)
    profiled = describe(capture.window, cfg.epochs) if profiler_attached() else None
    env = {**environment(cfg, notes, hosts), "left_out": left_out or None,
           "profiled_epochs": capture.epochs(epochs.start, epochs.stop) if profiled else None,
           **(strategy.record(model) if strategy.record else {})}
    metrics = MetricsFile(cfg, env, history, counted) if cfg.is_main else None
    rank0.say(cfg, f"{cfg.mode}: {cfg.world_size} process(es) on {cfg.device if cfg.world_size == 1 else cfg.backend}, "
                   f"{cfg.model}, global batch {cfg.batch_size} ({cfg.local_batch} per process), "
                   f"{steps} steps/epoch, dataset {cfg.dataset}"
                   + (f", profiling {profiled}" if profiled else ""))
    return metrics


def _restore(cfg, strategy, num_classes, *, raw, optimizer, scheduler, scaler):
    """Load every piece of state from the resume checkpoint; returns where to continue
    and the notes for the metrics."""
    path = resume_path(cfg)
    ckpt = load_checkpoint(path, torch.device(cfg.device))
    check_compatible(ckpt, cfg, num_classes, path)
    strategy.state.restore(ckpt, path, raw, optimizer)
    scheduler.load_state_dict(ckpt["scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    dropped = set_rng_state(ckpt["rng"])
    if dropped:  # gpu-only: tests/machine/test_gpu.py::test_a_two_gpu_checkpoint_resumes_where_one_gpu_is_visible
        rank0.say(cfg, f"note: {dropped}", err=True)
    rank0.say(cfg, f"resumed from {path} at epoch {ckpt['epoch'] + 1}, step {ckpt['step']}")
    return ckpt["epoch"], ckpt["step"], ckpt["best_acc"], list(ckpt["history"]), (dropped,) if dropped else ()


def check_compatible(ckpt: dict, cfg, num_classes: int, path: str) -> None:
    """Resuming into another model or class count, or into fp16 from a run without its
    GradScaler state, fails in one line; world size may change."""
    saved = ckpt.get("config", {}).get("model")
    if saved != cfg.model:
        raise UserError(f"{path} holds a {saved} but --model is {cfg.model}; "
                        f"pass --model {saved} or another checkpoint")
    saved_amp = ckpt.get("config", {}).get("amp", "off")
    if cfg.amp == "fp16" and not ckpt.get("scaler"):
        raise UserError(f"{path} was saved with --amp {saved_amp}, so it holds no GradScaler state for "
                        f"--amp fp16; resume with --amp {saved_amp}, or start afresh without --resume")
    head = [v for k, v in ckpt.get("model", {}).items() if k.endswith("head.weight")]
    if head and head[0].shape[0] != num_classes:
        raise UserError(f"{path} was trained on {head[0].shape[0]} classes but the dataset has "
                        f"{num_classes}; use the matching dataset or start without --resume")
