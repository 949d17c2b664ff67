"""What a mode hands the shared training run (`fit`, handler/train/trainer.py): the only way
modes differ once their processes have started."""
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

import torch

from ..data.loaders import Loaders
from .checkpoint import ModelState, PlainState
from .loop import Criterion, StepFn, Trainable
from .model_options import cross_entropy


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """Two fields every mode gives, `wrap` and `make_loaders`; the rest default to the plain
    loop's way and are set only by a mode that does it otherwise: its loss (`criterion`), its
    checkpoint state (`state`), collective evaluation (`lockstep_eval`), fallbacks and extra
    metrics entries (`notes`, `record`), and its own training step and evaluation (`step`,
    `evaluate`; pp's schedule)."""
    wrap: Callable[[torch.nn.Module], Trainable]  # plain model -> model that trains (DDP, DataParallel, FSDP, itself)
    make_loaders: Callable[..., Loaders]  # (cfg, splits) -> Loaders
    criterion: Criterion = cross_entropy  # (model, images, labels) -> (mean loss, correct)
    state: ModelState = field(default_factory=PlainState)  # how model/optimizer state enters checkpoints
    lockstep_eval: bool = False  # forward is a collective (FSDP): every rank runs the same eval steps
    notes: Tuple[str, ...] = ()  # fallbacks to record in the metrics
    record: Optional[Callable] = None  # wrapped model -> {key: value} added to the metrics' env (pp: its split)
    # A mode's own training step, (Step, images, labels, timer) -> device sums (loss*n, correct),
    # and evaluation, (wrapped model, loader, name, device, ...) -> dict; None: the loop's own,
    # the evaluation on the unwrapped model after rank 0's BatchNorm statistics are broadcast.
    step: Optional[StepFn] = None
    evaluate: Optional[Callable[..., dict]] = None
