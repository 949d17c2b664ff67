"""Stop a diverging run before it is saved: a non-finite loss, seen on the device.

Each step only updates two device tensors (no sync). Every CHECK_EVERY steps and at the
epoch's end, `check` reads them once and all ranks agree (MAX over the group), so a
rank whose loss went NaN stops every rank at the same step and nothing is written.
"""
import torch

from ..runtime import dist
from ..runtime.errors import UserError

CHECK_EVERY = 50


class Diverged(UserError):
    """The loss stayed non-finite; no checkpoint was written after it happened."""


class DivergenceGuard:
    """`patience` consecutive non-finite losses trip it: 1 normally; with fp16 and a
    GradScaler, skipped steps are how the scaler finds its scale, so only a longer run
    of them (--nan-patience) means the run diverged."""

    def __init__(self, device: torch.device, patience: int):
        self.patience = patience
        self._streak = torch.zeros((), dtype=torch.int64, device=device)
        self._tripped = torch.full((), -1, dtype=torch.int64, device=device)  # step where it tripped

    def observe(self, loss: torch.Tensor, step: int) -> None:
        self._streak = (self._streak + 1) * (~torch.isfinite(loss)).long()
        self._tripped = torch.where((self._tripped < 0) & (self._streak >= self.patience), step, self._tripped)

    def due(self, step: int) -> bool:
        return (step + 1) % CHECK_EVERY == 0

    def check(self, epoch: int) -> None:
        """Read the flag (a sync) on every rank at the same step; raise if any tripped."""
        tripped = self._tripped.clone()
        dist.all_reduce_max_tensor(tripped)
        step = int(tripped.item())
        if step >= 0:
            raise Diverged(divergence_message(epoch, step, self.patience))


def divergence_message(epoch: int, step: int, patience: int) -> str:
    streak = f"for {patience} steps in a row " if patience > 1 else ""
    return (f"the training loss became NaN/inf {streak}at epoch {epoch + 1}, step {step}; likely causes: "
            "a learning rate too high for this model and batch (--lr), or fp16 without loss scaling; "
            "lower --lr (or use --amp bf16) and continue from the last good checkpoint with --resume "
            "(nothing was saved after the loss diverged)")


def parameters_finite(model: torch.nn.Module) -> bool:
    """All ranks agree whether every parameter (each rank's shard under FSDP) is finite."""
    local = [getattr(p, "to_local")() if hasattr(p, "to_local") else p for p in model.parameters()]
    finite = bool(torch.stack([torch.isfinite(p).all() for p in local]).all()) if local else True
    return dist.all_reduce_max(int(not finite)) == 0
