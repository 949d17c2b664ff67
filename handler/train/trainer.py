"""`fit`: build the model and optimiser, resume, run the epochs, save, test, report.

Every mode calls this with two functions of its own: how to wrap the model and how
to load the data. Nothing here knows which mode is running.
"""
import math
import os
import time
from contextlib import nullcontext
from functools import partial

import torch

from models import build_model
from ..runtime import dist, rank0
from .checkpoint import load_checkpoint, make_checkpoint, save_atomic, set_rng_state
from ..runtime.cpu_memory import keep_freed_memory
from ..runtime.cpu_precision import bf16_note
from ..data.dataset import load_splits
from .capture import Capture, describe
from .divergence import Diverged, DivergenceGuard, parameters_finite
from ..runtime.errors import StopRequested, UserError
from .loop import Step, evaluate, train_epoch
from .metrics import MetricsFile, environment
from .optimizer import build_sgd, settle
from .model_options import checkpoint_stages
from .strategy import Strategy
from ..runtime.names import CHECKPOINT, HOST, RANK, TEST, VALIDATE
from ..runtime.nvtx import nvtx_mark, nvtx_range, profiler_attached
from ..runtime.stopping import StopFlag

WARMUP_EPOCHS = 1


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


def epoch_seed(cfg, epoch: int) -> int:
    """Augmentation randomness depends only on (seed, epoch, rank): resumed runs replay it."""
    return cfg.seed + 1_000_003 * (epoch + 1) + 7919 * cfg.rank


def _evaluate_replicas(raw, loader, name: str, **options) -> dict:
    """The loop's evaluation on the unwrapped model, after every rank takes rank 0's
    BatchNorm statistics (they stay rank-local in training)."""
    dist.broadcast_buffers(raw)
    return evaluate(raw, loader, name, **options)


def fit(cfg, strategy: Strategy) -> dict:
    device = torch.device(cfg.device)
    if device.type == "cpu":
        keep_freed_memory()  # else glibc maps and zeroes every step's activations afresh
    # Fixed input shapes: cuDNN's autotuner picks the fastest kernels once and reuses them.
    torch.backends.cudnn.benchmark = device.type == "cuda"
    capture = Capture.start(cfg.profile_epochs, cfg.epochs)  # docs/PROFILING.md, "Capture window"
    nvtx_mark(RANK(cfg.rank))
    started = time.perf_counter()
    splits = load_splits(cfg)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    raw = build_model(cfg.model, len(splits.classes)).to(device)
    if cfg.channels_last:
        raw = raw.to(memory_format=torch.channels_last)
    if cfg.activation_checkpointing:
        checkpoint_stages(raw)
    # Wrap first: FSDP replaces the parameters with shards, and the optimizer (and any
    # restored state) must see the ones that train. DDP and DP keep the same tensors.
    model = strategy.wrap(raw)
    optimizer, optimizer_note = build_sgd(cfg, raw.parameters(), device, scaler_enabled=cfg.amp == "fp16")
    loaders = strategy.make_loaders(cfg, splits)
    if len(loaders.train) == 0:
        raise UserError(f"{len(splits.train[1])} training images give no full batch of {cfg.local_batch} "
                        "per process; use a smaller --batch-size or more data")
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
    evaluate_on = partial(_evaluate_replicas, raw, device=device, autocast=step.autocast,
                          channels_last=cfg.channels_last, lockstep=strategy.lockstep_eval)
    if strategy.evaluate:  # the mode evaluates through its wrapper (pp: stage after stage)
        evaluate_on = partial(strategy.evaluate, model, device=device, autocast=step.autocast)
    save = partial(_save, cfg, strategy.state, raw=raw, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    notes = strategy.notes + resume_notes
    if optimizer_note:  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_with_every_flag_validate_accepts_for_it_on_gpus[fsdp-1]
        notes += (optimizer_note,)
        rank0.say(cfg, f"warning: {optimizer_note}", err=True)
    if cfg.amp == "bf16" and device.type == "cpu":
        note = bf16_note()
        if note:
            notes += (note,)
            rank0.say(cfg, f"warning: {note}", err=True)
    hosts = dist.hostnames()
    nvtx_mark(HOST(hosts[cfg.rank]))  # the profile report names each rank's host
    last_epoch = min(cfg.epochs, start_epoch + cfg.stop_after) if cfg.stop_after else cfg.epochs
    capture.marks = (RANK(cfg.rank), HOST(hosts[cfg.rank]))
    capture_note = capture.fit_to(start_epoch, last_epoch)
    if capture_note and profiler_attached():
        notes += (capture_note,)
        rank0.say(cfg, f"warning: {capture_note}", err=True)
    profiled = describe(capture.window, cfg.epochs) if profiler_attached() else None
    env = {**environment(cfg, notes, hosts), "profiled_epochs": capture.epochs(start_epoch, last_epoch)
           if profiled else None, **(strategy.record(model) if strategy.record else {})}
    metrics = MetricsFile(cfg, env, history) if cfg.is_main else None
    rank0.say(cfg, f"{cfg.mode}: {cfg.world_size} process(es) on {cfg.device if cfg.world_size == 1 else cfg.backend}, "
                   f"{cfg.model}, global batch {cfg.batch_size} ({cfg.local_batch} per process), "
                   f"{len(loaders.train)} steps/epoch, dataset {cfg.dataset}"
                   + (f", profiling {profiled}" if profiled else ""))

    stop = StopFlag()
    guard = DivergenceGuard(device, cfg.nan_patience if scaler.is_enabled() else 1)
    try:
        for epoch in range(start_epoch, last_epoch):
            torch.manual_seed(epoch_seed(cfg, epoch))
            capture.before_epoch(epoch)
            first_step, start_step = start_step, 0
            with rank0.progress(cfg, len(loaders.train), f"epoch {epoch + 1}/{cfg.epochs}") as bar:
                train = train_epoch(step, loaders.train, epoch, device, bar, stop=stop, guard=guard,
                                    start_step=first_step)
            if train["stopped_at"] is not None:
                save(epochs_done=epoch, step=train["stopped_at"], best_acc=best_acc, history=history)
                dist.barrier()  # no rank exits before rank 0 has written it: srun ends a step soon after its first task
                rank0.say(cfg, f"stopped by {stop.agreed_signal().name} at epoch {epoch + 1}, step "
                               f"{train['stopped_at']}; continue with --resume (checkpoint in {cfg.ckpt})")
                raise StopRequested(stop.agreed_signal())
            val = {"loss": None, "acc": None, "samples": 0}
            if loaders.valid is not None:
                val = evaluate_on(loaders.valid, VALIDATE)
            record = _epoch_record(epoch, train, val, first_step)
            history.append(record)
            improved = val["acc"] is not None and val["acc"] > best_acc
            best_acc = max(best_acc, val["acc"] or -1.0)
            if metrics is not None:  # rank 0's
                metrics.add_epoch(record)
                _report_epoch(cfg, record)
            save(epochs_done=epoch + 1, step=0, best_acc=best_acc, history=history, improved=improved)
            capture.after_epoch(epoch)
    except Diverged:
        if not cfg.is_main:
            raise SystemExit(2) from None  # every rank agreed; rank 0 says it once
        raise
    finally:
        stop.close()

    test = evaluate_on(loaders.test, TEST)
    capture.close_run()
    total = time.perf_counter() - started
    if metrics is not None:  # rank 0's
        metrics.finish(test, total)
        rank0.say(cfg, f"test: loss {test['loss']:.4f}  acc {100 * test['acc']:.2f}%  "
                       f"({test['samples']} images)  total {total:.1f} s  metrics -> {cfg.metrics}")
    return {"test": test, "epochs": history, "total_time_s": total}


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


def _epoch_record(epoch, train, val, first_step) -> dict:
    record = {"epoch": epoch, "time_s": train["time_s"], "train_samples": train["samples"],
              "train_loss": train["loss"], "train_acc": train["acc"],
              "images_per_s": train["samples"] / train["time_s"], "data_wait_s": train["data_wait_s"],
              "phase_s": train["phase_s"], "val_loss": val["loss"], "val_acc": val["acc"], "val_samples": val["samples"]}
    if first_step:
        record["resumed_at_step"] = first_step  # the epoch's sums cover only the steps after it
    return record


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


def _report_epoch(cfg, r):
    val = f"  val {100 * r['val_acc']:.2f}%" if r["val_acc"] is not None else ""
    rank0.say(cfg, f"epoch {r['epoch'] + 1}/{cfg.epochs}  loss {r['train_loss']:.4f}  "
                   f"acc {100 * r['train_acc']:.2f}%{val}  {r['time_s']:.1f} s  "
                   f"{r['images_per_s']:.0f} img/s  data-wait {100 * r['data_wait_s'] / r['time_s']:.1f}%")


def _save(cfg, state, *, raw, optimizer, scheduler, scaler, epochs_done, step, best_acc, history,
          improved=False):
    """Every rank hands over its state (sharded modes write shards here); rank 0 then
    writes last.pt, and best.pt when validation improved."""
    if cfg.save == "none":
        return
    if not parameters_finite(raw):  # never replace the last good checkpoint with NaN weights
        raise Diverged(f"the weights hold NaN/inf after epoch {epochs_done}, step {step}; nothing was saved "
                       f"and {os.path.join(cfg.ckpt, 'last.pt')} keeps the last good state: lower --lr "
                       "(or use --amp bf16) and continue with --resume")
    with nvtx_range(CHECKPOINT):
        os.makedirs(cfg.ckpt, exist_ok=True)
        captured = state.capture(cfg, raw, optimizer, tag=f"e{epochs_done}s{step}")
        failure = None
        if cfg.is_main:
            try:
                _write(cfg, state, captured, make_checkpoint(
                    state=captured, scheduler=scheduler, scaler=scaler, epoch=epochs_done, step=step,
                    best_acc=best_acc, history=history, config=cfg.as_dict()), improved)
            except UserError as err:  # a full disk: the old checkpoint is kept
                failure = err
        # Every rank learns whether rank 0's write failed, so the others stop quietly
        # instead of each reporting a lost rank 0 (docs/FAILURES.md).
        if dist.all_reduce_max(int(failure is not None)):
            if failure is not None:
                raise failure
            raise SystemExit(2)  # rank 0 says why, in one line


def _write(cfg, state, captured: dict, ckpt: dict, improved: bool) -> None:
    """Rank 0: last.pt, and best.pt when validation improved."""
    save_atomic(ckpt, os.path.join(cfg.ckpt, "last.pt"))
    if improved:
        save_atomic(ckpt, os.path.join(cfg.ckpt, "best.pt"))
    state.keep(cfg.ckpt, last=captured, best=captured if improved else None)
