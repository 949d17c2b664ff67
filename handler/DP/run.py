"""The DP mode's entry: one process; nn.DataParallel over the GPUs, or plain CPU."""
import dataclasses
from functools import partial

import torch
from torch import nn

from ..runtime import rank0
from ..train.model_options import cross_entropy
from ..train.strategy import Strategy
from ..train.build import autocast_for
from ..train.trainer import fit
from ..DDP.cifar10_loader import get_DDP_loader
from ..data.loaders import lab_loaders
from .balanced import LossInside, replica_cross_entropy
from .options import DPOptions
from .precision import AutocastInside

CPU_NOTE = "no GPU: DP needs GPUs to split work, so this runs one plain CPU process"


def run(cfg) -> None:
    notes = []
    if cfg.use_cuda:
        cfg = dataclasses.replace(cfg, device="cuda:0", backend="none")  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[dp]
    else:
        notes.append(CPU_NOTE)
        rank0.say(cfg, f"dp: {CPU_NOTE}")
    # One replica of the DDP loader is a plain seeded shuffle; same data semantics as ddp.
    fit(cfg, Strategy(wrap=partial(wrap, cfg), make_loaders=partial(lab_loaders, get_DDP_loader),
                      criterion=replica_cross_entropy if DPOptions.of(cfg).dp_balanced else cross_entropy,
                      notes=tuple(notes)))


def wrap(cfg, model: nn.Module) -> nn.Module:
    if cfg.use_cuda and cfg.amp != "off":
        model = AutocastInside(model, autocast_for(cfg, torch.device(cfg.device)))  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_with_every_flag_validate_accepts_for_it_on_gpus[dp-1]
    if DPOptions.of(cfg).dp_balanced:
        model = LossInside(model)
    if cfg.use_cuda:
        model = nn.DataParallel(model, device_ids=list(range(cfg.num_gpu)))  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[dp]
    return model
