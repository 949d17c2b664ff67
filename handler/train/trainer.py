"""`fit`: one training run as an outline. `build_run` (build.py) makes the run; each epoch
then trains, validates and saves; the test set ends it.

Modes reach it through their Strategy (strategy.py): how to wrap the model, where batches
come from, and the few steps a mode does its own way. Nothing here knows which mode runs.
"""
import os
import time

import torch

from ..runtime import dist, rank0
from .build import Run, build_run
from .checkpoint import make_checkpoint, save_atomic
from ..data.cpu_time import CpuClock
from .divergence import Diverged, DivergenceGuard, parameters_finite
from ..runtime.errors import StopRequested, UserError
from .loop import train_epoch
from .strategy import Strategy
from ..runtime.names import CHECKPOINT, EPOCH, TEST, VALIDATE
from ..runtime.nvtx import nvtx_range
from ..runtime.phases import entered
from ..runtime.stopping import StopFlag


def epoch_seed(cfg, epoch: int) -> int:
    """Augmentation randomness depends only on (seed, epoch, rank): resumed runs replay it."""
    return cfg.seed + 1_000_003 * (epoch + 1) + 7919 * cfg.rank


def fit(cfg, strategy: Strategy) -> dict:
    """Build the run, then per epoch train, validate and save; then test. A stop request
    saves where the ranks stopped and ends the run (resume continues there); a divergence
    ends it on every rank, rank 0 saying why."""
    run = build_run(cfg, strategy)
    stop = StopFlag()
    guard = DivergenceGuard(run.device, cfg.nan_patience if run.step.scaler.is_enabled() else 1)
    try:
        for epoch in range(run.start_epoch, run.last_epoch):
            first_step = run.start_step if epoch == run.start_epoch else 0
            train = _train(run, epoch, first_step, stop, guard)
            if train["stopped_at"] is not None:
                _save_and_stop(run, epoch, train["stopped_at"], stop)
            val = _validate(run)
            improved = _record(run, _epoch_record(epoch, train, val, first_step))
            _save_run(run, epochs_done=epoch + 1, step=0, improved=improved)
            run.capture.after_epoch(epoch)
    except Diverged:
        if not cfg.is_main:
            raise SystemExit(2) from None  # every rank agreed; rank 0 says it once
        raise
    finally:
        stop.close()
    return _test(run)


def _train(run: Run, epoch: int, first_step: int, stop: StopFlag, guard: DivergenceGuard) -> dict:
    torch.manual_seed(epoch_seed(run.cfg, epoch))
    run.capture.before_epoch(epoch)
    clock = CpuClock()
    with rank0.progress(run.cfg, len(run.loaders.train), f"epoch {epoch + 1}/{run.cfg.epochs}") as bar:
        train = train_epoch(run.step, run.loaders.train, epoch, run.device, bar, stop=stop, guard=guard,
                            start_step=first_step)
    last = train["stopped_at"] if train["stopped_at"] is not None else len(run.loaders.train)
    return {**train, "cpu_time": clock.cpu_time(last - first_step, run.device)}


def _save_and_stop(run: Run, epoch: int, stopped_at: int, stop: StopFlag) -> None:
    """The ranks agreed to stop after step `stopped_at`: save there, then end the run."""
    _save_run(run, epochs_done=epoch, step=stopped_at)
    dist.barrier()  # no rank exits before rank 0 has written it: srun ends a step soon after its first task
    rank0.say(run.cfg, f"stopped by {stop.agreed_signal().name} at epoch {epoch + 1}, step "
                       f"{stopped_at}; continue with --resume (checkpoint in {run.cfg.ckpt})")
    raise StopRequested(stop.agreed_signal())


def _validate(run: Run) -> dict:
    if run.loaders.valid is None:  # --valid-size 0
        return {"loss": None, "acc": None, "samples": 0}
    entered(VALIDATE)
    return run.evaluate(run.loaders.valid, VALIDATE)


def _record(run: Run, record: dict) -> bool:
    """Add the epoch to the history (and rank 0's metrics file); True when validation improved."""
    run.history.append(record)
    improved = record["val_acc"] is not None and record["val_acc"] > run.best_acc
    run.best_acc = max(run.best_acc, record["val_acc"] or -1.0)
    if run.metrics is not None:  # rank 0's
        run.metrics.add_epoch(record)
        _report_epoch(run.cfg, record)
    return improved


def _test(run: Run) -> dict:
    entered(TEST)
    test = run.evaluate(run.loaders.test, TEST)
    run.capture.close_run()
    total = time.perf_counter() - run.started
    if run.metrics is not None:  # rank 0's
        run.metrics.finish(test, total)
        rank0.say(run.cfg, f"test: loss {test['loss']:.4f}  acc {100 * test['acc']:.2f}%  "
                           f"({test['samples']} images)  total {total:.1f} s  metrics -> {run.cfg.metrics}")
    return {"test": test, "epochs": run.history, "total_time_s": total}


def _save_run(run: Run, *, epochs_done: int, step: int, improved: bool = False) -> None:
    _save(run.cfg, run.state, raw=run.raw, optimizer=run.step.optimizer, scheduler=run.step.scheduler,
          scaler=run.step.scaler, epochs_done=epochs_done, step=step, best_acc=run.best_acc,
          history=run.history, improved=improved)


def _epoch_record(epoch, train, val, first_step) -> dict:
    record = {"epoch": epoch, "time_s": train["time_s"], "train_samples": train["samples"],
              "train_loss": train["loss"], "train_acc": train["acc"],
              "images_per_s": train["samples"] / train["time_s"], "data_wait_s": train["data_wait_s"],
              "phase_s": train["phase_s"], "cpu_time": train.get("cpu_time"), "val_loss": val["loss"], "val_acc": val["acc"], "val_samples": val["samples"]}
    if first_step:
        record["resumed_at_step"] = first_step  # the epoch's sums cover only the steps after it
    return record


def _report_epoch(cfg, r):
    val = f"  val {100 * r['val_acc']:.2f}%" if r["val_acc"] is not None else ""
    # The console counts epochs from 1; NVTX, --profile-epochs, the metrics and the report from 0,
    # so each line names the range the profile holds for it.
    rank0.say(cfg, f"epoch {r['epoch'] + 1}/{cfg.epochs} [nvtx: {EPOCH(r['epoch'])}]  loss {r['train_loss']:.4f}  "
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
    entered(CHECKPOINT)
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
