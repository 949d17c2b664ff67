"""One training step loop and one evaluation loop, shared by every mode.

Modes differ only in how the model is wrapped and where batches come from; both
arrive here already built. Per-step work never syncs the device: running sums stay
on the device, sample counts on the host, and both are read once per epoch (the
divergence check reads one flag every CHECK_EVERY steps).
"""
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Optional, Protocol, Tuple

import torch
import torch.nn.functional as F

from ..runtime import dist
from .model_options import cross_entropy
from ..runtime.names import BACKWARD, BATCH, DATA, EPOCH, FORWARD, OPTIMIZER
from ..runtime.nvtx import nvtx_range
from ..runtime.phases import Phase, PhaseTimer, at_step, untimed


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # gpu-only: tests/machine/test_gpu.py::test_cuda_event_phase_timers_add_up_to_the_epochs_wall_time


class Trainable(Protocol):
    """The model that trains: an nn.Module (plain, DDP, DataParallel, FSDP) or pp's Pipeline."""

    def train(self, mode: bool = True) -> Any: ...


@dataclass(frozen=True)
class Step:
    """What one optimisation step needs; AMP parts are no-ops when AMP is off."""
    model: Trainable
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable[[], ContextManager]  # torch.autocast(...) or nullcontext
    accum_steps: int = 1
    channels_last: bool = False
    criterion: "Criterion" = cross_entropy  # (model, images, labels) -> (mean loss, correct count)
    optimise: Optional["StepFn"] = None  # a mode's own step (Strategy.step); None: _optimise


Criterion = Callable[[Trainable, torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
StepFn = Callable[[Step, torch.Tensor, torch.Tensor, Phase], torch.Tensor]  # -> device sums (loss*n, correct)


def _micro_batches(images, labels, k):
    if k == 1:
        return [(images, labels)]
    return list(zip(images.chunk(k), labels.chunk(k)))


def train_epoch(step: Step, loader, epoch: int, device: torch.device, bar, *, stop, guard,
                start_step: int = 0) -> dict:
    """Train one epoch; returns global sums (all ranks) and this rank's timings.

    `start_step` > 0 resumes mid-epoch: the loader replays the steps already done
    (same order, same augmentation draws) without training on them. `stopped_at` is
    the step index where an agreed stop request ended the epoch, else None. `guard`
    (a DivergenceGuard) raises, on every rank alike, once the loss stays non-finite.
    """
    step.model.train()
    totals = torch.zeros(2, device=device, dtype=torch.float64)  # loss*n, correct
    samples, stopped_at = 0, None
    phase = PhaseTimer(device)
    sync(device)
    # The clock starts before the loader's per-epoch set-up (DALI rebuilds its pipeline,
    # DataLoader starts its workers), so every mode pays for it inside the epoch; it
    # counts as waiting for data.
    start = time.perf_counter()
    at_step(epoch, start_step)
    with nvtx_range(EPOCH(epoch)):
        with phase(DATA):
            loader.set_epoch(epoch)
            batches = iter(loader)
            for _ in range(start_step):
                next(batches)
        bar.update(start_step)
        for i in range(start_step, len(loader)):
            if stop.should_stop():
                stopped_at = i
                break
            at_step(epoch, i)
            with nvtx_range(BATCH(i)):
                with phase(DATA):
                    images, labels = next(batches)
                if step.channels_last:
                    images = images.contiguous(memory_format=torch.channels_last)
                sums = (step.optimise or _optimise)(step, images, labels, phase)
                totals += sums
                samples += labels.shape[0]
                guard.observe(sums[0], i)
            if guard.due(i):
                guard.check(epoch)
            bar.update(1)
    guard.check(epoch)
    sync(device)
    elapsed = time.perf_counter() - start
    return {"time_s": elapsed, "data_wait_s": phase.waited(), "phase_s": phase.seconds(), "stopped_at": stopped_at,
            **_summarise(totals, samples)}


def _optimise(step: Step, images, labels, phase: Phase = untimed) -> torch.Tensor:
    """Forward/backward over the micro-batches, then one optimizer step; returns
    (loss * n, correct) on the device, without waiting for it.

    Only the last micro-batch's backward all-reduces (DDP no_sync on the others), and
    each micro-loss is weighted by its share of the batch, so K micro-batches give the
    gradient of one full batch.
    """
    parts = _micro_batches(images, labels, step.accum_steps)
    n = labels.shape[0]
    sums = torch.zeros(2, device=labels.device, dtype=torch.float64)  # loss*n, correct
    no_sync = getattr(step.model, "no_sync", nullcontext)
    for j, (x, y) in enumerate(parts):
        # DDP decides in forward whether the coming backward all-reduces.
        with no_sync() if j < len(parts) - 1 else nullcontext():
            with phase(FORWARD), step.autocast():
                loss, right = step.criterion(step.model, x, y)
            with phase(BACKWARD):
                step.scaler.scale(loss * (y.shape[0] / n)).backward()
        sums += torch.stack([loss.detach().double() * y.shape[0], right.double()])
    update(step, phase)
    return sums


def update(step: Step, phase: Phase = untimed) -> None:
    """The optimiser's part of a step (every mode's, pp's included): scaled step, zeroed
    gradients, learning-rate schedule."""
    with phase(OPTIMIZER):
        step.scaler.step(step.optimizer)
        step.scaler.update()
        step.optimizer.zero_grad(set_to_none=True)
        step.scheduler.step()


@torch.no_grad()
def evaluate(model, loader, name: str, device: torch.device, autocast=nullcontext,
             channels_last: bool = False, lockstep: bool = False) -> dict:
    """Loss/accuracy over the loader, summed over ranks; each image counted once.

    With `lockstep` (the forward is itself a collective, as in FSDP) a rank whose
    shard ran out runs a one-image dummy forward, counted nowhere, until all are done.
    """
    model.eval()
    totals = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum, correct
    samples = 0
    steps = dist.all_reduce_max(len(loader)) if lockstep else len(loader)
    batches = in_data_ranges(loader)
    with nvtx_range(name):
        for _ in range(steps):
            batch = next(batches, None)
            if batch is None:
                model(torch.zeros(1, 3, 32, 32, device=device))
                continue
            images, labels = batch
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with autocast():
                logits = model(images)
            loss = F.cross_entropy(logits.float(), labels, reduction="sum")
            totals += torch.stack([loss.double(), (logits.argmax(1) == labels).sum().double()])
            samples += labels.shape[0]
    return _summarise(totals, samples)


def in_data_ranges(loader) -> Iterator:
    """Evaluation's batches, each wait for one inside a `data` range as in training (evaluation
    is one range, not split into timed phases)."""
    batches = iter(loader)
    while True:
        with nvtx_range(DATA):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


def _summarise(totals: torch.Tensor, samples: int) -> dict:
    """Global (all-rank) mean loss and accuracy from this rank's device sums and host count."""
    totals = torch.cat([totals, torch.tensor([float(samples)], dtype=torch.float64).to(totals.device)])
    dist.all_reduce_sum(totals)
    loss_sum, correct, n = totals.tolist()
    return {"loss": loss_sum / max(n, 1), "acc": correct / max(n, 1), "samples": int(n)}
