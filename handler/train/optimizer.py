"""The one optimiser, SGD with Nesterov momentum, and how it meets fp16's GradScaler.

GradScaler.step reads found_inf on the host (`.item()`, a device sync every step) unless the
optimiser skips an overflowed step itself. The fused SGD does, in its kernel
(`_step_supports_amp_scaling`, torch 2.6-2.14 alike), so fp16 on CUDA uses it; its results
equal the plain SGD's.

One trap: the fused first step creates the momentum buffers uninitialised and fills them in
the kernel, which an overflowed step skips. GradScaler's first steps often overflow while the
scale settles, and the next step then starts from garbage. Buffers of zeros before the first
step give the same update (momentum * 0 + grad, dampening being 0) and survive a skip.
"""
from typing import Tuple

import torch

NO_FUSED_DTENSOR = ("--amp fp16 on sharded (DTensor) parameters: torch has no fused SGD for them "
                    "(aten._fused_sgd_), so GradScaler reads found_inf on the host every step, one "
                    "device sync per step; --amp bf16 needs no GradScaler")


def sgd_options(device: torch.device, scaler_enabled: bool, params) -> Tuple[dict, str]:
    """Extra SGD keyword arguments for this device and scaler, and a note when the step
    still syncs (fsdp's DTensor parameters)."""
    if not scaler_enabled or device.type != "cuda":
        return {}, ""
    from torch.distributed.tensor import DTensor  # here: its import costs every process 0.6 s
    if any(isinstance(p, DTensor) for p in params):
        return {}, NO_FUSED_DTENSOR
    return {"fused": True}, ""


def build_sgd(cfg, params, device: torch.device, scaler_enabled: bool) -> Tuple[torch.optim.SGD, str]:
    params = list(params)
    options, note = sgd_options(device, scaler_enabled, params)
    optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=True,
                                weight_decay=cfg.weight_decay, **options)
    return optimizer, note


def settle(optimizer: torch.optim.Optimizer) -> None:
    """After any restored state, before the first step: this run's own kernel choice (a
    checkpoint's param_groups carry the saving run's `fused`, and a fused SGD made unfused
    by them fails GradScaler's first step), and zero momentum buffers where the fused SGD
    has none yet (see the module docstring)."""
    fused = optimizer.defaults.get("fused")  # True, or None: torch's default (foreach on CUDA)
    for group in optimizer.param_groups:
        group["fused"] = fused
        if not fused or group["momentum"] == 0 or group["dampening"] != 0:
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p)
