"""The DP mode's entry: one process; nn.DataParallel over the GPUs, or plain CPU."""
import dataclasses

import torch
from torch import nn

from ..common import rank0
from ..common.trainer import fit
from ..DDP.cifar10_loader import get_DDP_loader

CPU_NOTE = "no GPU: DP needs GPUs to split work, so this runs one plain CPU process"


def run(cfg) -> None:
    notes = []
    if cfg.use_cuda:
        cfg = dataclasses.replace(cfg, device="cuda:0", backend="none")
        device_ids = list(range(cfg.num_gpu))
        wrap = lambda model: nn.DataParallel(model, device_ids=device_ids)  # noqa: E731
    else:
        notes.append(CPU_NOTE)
        rank0.say(cfg, f"dp: {CPU_NOTE}")
        wrap = lambda model: model  # noqa: E731
    # One replica of the DDP loader is a plain seeded shuffle; same data semantics as ddp.
    fit(cfg, wrap=wrap, make_loaders=get_DDP_loader, notes=notes)
