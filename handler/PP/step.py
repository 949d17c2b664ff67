"""The pp mode's training step and evaluation, plugged into the shared loop.

The step returns the loop's device sums (loss * n, correct): the last stage fills them,
every other stage returns zeros, and the loop's end-of-epoch all-reduce adds them up, so
rank 0 reports the last stage's numbers. The loader gives labels only to the last stage,
so the loop's sample count also counts each image once.
"""
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from ..train.loop import _summarise, in_data_ranges, update
from ..runtime.names import RECV, SEND
from ..runtime.nvtx import nvtx_range
from ..runtime.phases import Phase, untimed


def pipeline_step(step, images, labels, phase: Phase = untimed) -> torch.Tensor:
    """One optimisation step: the schedule runs forward and backward of all micro-batches,
    then each stage updates its own parameters (no gradient crosses stages)."""
    sums = step.model.train_step(images, labels, phase)
    update(step, phase)
    return sums


@torch.no_grad()
def evaluate_pipeline(pipe, loader, name: str, device: torch.device, **_) -> dict:
    """Loss/accuracy over the loader, each image once: whole batches pass through the
    stages in turn (no micro-batches: no backward waits on them). Batch sizes vary at the
    end of the set, so each activation is preceded by its batch size."""
    pipe.eval()
    totals = torch.zeros(2, device=device, dtype=torch.float64)
    samples = 0
    with nvtx_range(name):
        for images, labels in in_data_ranges(loader):
            if pipe.first:
                x = images
            else:
                n = torch.zeros(1, dtype=torch.int64, device=device)
                with nvtx_range(RECV):
                    tdist.recv(n, src=pipe.index - 1)
                    x = torch.empty((int(n.item()), *pipe.in_shape), dtype=pipe.wire_dtype, device=device)
                    tdist.recv(x, src=pipe.index - 1)
            out = pipe.module(x)
            if not pipe.last:
                with nvtx_range(SEND):
                    tdist.send(torch.tensor([out.shape[0]], dtype=torch.int64, device=device), dst=pipe.index + 1)
                    tdist.send(out.contiguous(), dst=pipe.index + 1)
                continue
            loss = F.cross_entropy(out, labels, reduction="sum")
            totals += torch.stack([loss.double(), (out.argmax(1) == labels).sum().double()])
            samples += labels.shape[0]
    return _summarise(totals, samples)
