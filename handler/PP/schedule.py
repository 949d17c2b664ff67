"""This process's pipeline stage and its schedule (GPipe or 1F1B), with NVTX ranges.

torch.distributed.pipelining moves the activations and gradients; `TracedStage` only
marks, per micro-batch j, `fwd mb{j}` and `bwd mb{j}` inside the loop's `forward` and
`backward` phases, and `send` / `recv` from the moment the stage hands the schedule its
communication until its next piece of work, which is where it waits for a neighbour
(docs/PROFILING.md; names from handler/runtime/names.py).
"""
import inspect
import sys
import time
from contextlib import nullcontext
from functools import partial
from typing import Optional

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from ..runtime.errors import UserError
from ..runtime import nvtx
from ..runtime.names import BACKWARD, BWD_MB, FORWARD, FWD_MB, RECV, SEND, Numbered
from ..runtime.phases import Phase, untimed
from .split import plan_split, stage_units
from .stages import StageModule, boundary_shapes, prune

try:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
except ImportError:  # before torch 2.4
    PipelineStage = None

def require_pipelining() -> None:
    """pp relies on 2.6's pipelining: meta-device stage shapes and the schedules' stage calls."""
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if PipelineStage is None or version < (2, 6):
        raise UserError(f"--mode pp needs torch.distributed.pipelining from torch 2.6 or newer; "
                        f"this is torch {torch.__version__}: upgrade torch")
    from .old_torch import patch_batch_p2p
    patch_batch_p2p()


if PipelineStage is not None:
    class TracedStage(PipelineStage):
        """A PipelineStage that times and names its work; `phase` is set per step."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.phase: Phase = untimed
            self.busy_s = 0.0  # compute seconds, read by bench/pp.py
            self._waiting = False  # a send/recv range is open

        def waiting(self, name=None):
            """Close the open send/recv range; open `name` when given."""
            if self._waiting:
                nvtx.pop()
            self._waiting = name is not None and nvtx.push(name)

        def _traced(self, work: Numbered, phase: str, method, chunk, *args, **kwargs):
            self.waiting()
            start = time.perf_counter()
            with self.phase(phase), nvtx.nvtx_range(work(chunk)):
                out = method(chunk, *args, **kwargs)
            self.busy_s += time.perf_counter() - start
            return out

        def forward_one_chunk(self, chunk, *args, **kwargs):
            return self._traced(FWD_MB, FORWARD, super().forward_one_chunk, chunk, *args, **kwargs)

        def backward_one_chunk(self, chunk, *args, **kwargs):
            return self._traced(BWD_MB, BACKWARD, super().backward_one_chunk, chunk, *args, **kwargs)

        def _ops(self, name, ops):
            self.waiting(name if ops else None)
            return ops

        def get_fwd_recv_ops(self, chunk):
            return self._ops(RECV, super().get_fwd_recv_ops(chunk))

        def get_bwd_recv_ops(self, chunk):
            return self._ops(RECV, super().get_bwd_recv_ops(chunk))

        def get_fwd_send_ops(self, chunk):
            return self._ops(SEND, super().get_fwd_send_ops(chunk))

        def get_bwd_send_ops(self, chunk):
            return self._ops(SEND, super().get_bwd_send_ops(chunk))


def _unscaled() -> dict:
    """torch 2.7+ divides gradients by M after the step (scale_grads); 2.6 never does.
    Turning it off where it exists and dividing the loss by M instead gives the same
    gradients on every version."""
    params = inspect.signature(ScheduleGPipe.__init__).parameters
    return {"scale_grads": False} if "scale_grads" in params else {}


class Pipeline:
    """What the pp step and evaluation drive: this rank's stage, its schedule, its peers."""

    def __init__(self, module: StageModule, index: int, stages: int, device, microbatches: int,
                 schedule: str, batch_size: int, in_shape, out_shape, channels_last: bool = False):
        self.module, self.index, self.stages = module, index, stages
        self.first, self.last = index == 0, index == stages - 1
        self.microbatches, self.device = microbatches, device
        self.split: dict = {}  # handler/PP/split.py's record, set by model_to_pipeline
        self.in_shape, self.wire_dtype = in_shape, module.wire_dtype
        mb = batch_size // microbatches
        # Shapes given up front (on the meta device): no inference pass, which would run
        # an extra forward through BatchNorm on some torch versions.
        in_dtype = torch.float32 if self.first else self.wire_dtype
        out_dtype = torch.float32 if self.last else self.wire_dtype
        # Activations between stages carry gradients back; the images and logits do not.
        # The loop hands the first stage channels_last images under --channels-last; the
        # stage's example must have their strides (torch 2.6-2.11 compare them every step).
        in_format = torch.channels_last if channels_last and self.first else torch.contiguous_format
        example_in = torch.empty((mb, *in_shape), dtype=in_dtype, device="meta", requires_grad=not self.first,
                                 memory_format=in_format)
        example_out = torch.empty((mb, *out_shape), dtype=out_dtype, device="meta", requires_grad=not self.last)
        self.stage = TracedStage(module, index, stages, device, input_args=example_in, output_args=example_out)
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = kind(self.stage, microbatches, loss_fn=self._loss, **_unscaled())

    def _loss(self, logits, labels):
        return F.cross_entropy(logits, labels) / self.microbatches

    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def train_step(self, images, labels, phase: Phase = untimed) -> torch.Tensor:
        """Forward and backward of every micro-batch; returns (loss * n, correct) on the
        last stage and zeros elsewhere (the loop sums them over ranks)."""
        self.stage.phase = phase
        losses = []
        args = (images,) if self.first else ()
        kwargs = {"target": labels, "losses": losses} if self.last else {}
        try:
            logits = self.schedule.step(*args, **kwargs)
        finally:
            self.stage.waiting()  # the last send/recv range ends with the step
        if not self.last:
            return torch.zeros(2, dtype=torch.float64, device=self.device)
        # Each loss is a micro-batch mean divided by M; equal micro-batches make their sum the batch mean.
        loss = torch.stack([l.detach() for l in losses]).sum().double() * labels.shape[0]
        correct = (logits.detach().argmax(1) == labels).sum().double()
        return torch.stack([loss, correct])


def autocast_factory(amp: str, device):
    if amp == "bf16":
        return partial(torch.autocast, device.type, dtype=torch.bfloat16)
    return nullcontext


def model_to_pipeline(model, *, microbatches: int, schedule: str, batch_size: int, amp: str,
                      channels_last: bool = False, split: str = "time", model_name: str = "",
                      cache: Optional[str] = None, verbose: bool = True) -> Pipeline:
    """Keep this rank's stage of `model` (pruned in place: the optimizer and checkpoints
    then see only its parameters) and build its pipeline. Rank r runs stage r; `split`
    picks the cut (handler/PP/split.py), timings cached in the file `cache`."""
    require_pipelining()
    index, stages = tdist.get_rank(), tdist.get_world_size()
    device = next(model.parameters()).device
    autocast = autocast_factory(amp, device)
    record = plan_split(model, split, model_name=model_name or type(model).__name__,
                        micro_batch=batch_size // microbatches, autocast=autocast, amp=amp,
                        channels_last=channels_last, cache_path=cache)
    shapes = boundary_shapes(model, device)
    if verbose and index == 0:
        print(f"pp: {record['text']}", flush=True)
        if record.get("cache_problem"):
            print(f"warning: pp: {record['cache_problem']}", file=sys.stderr, flush=True)
    units = stage_units(record, index)
    first, last = index == 0, index == stages - 1
    in_shape = (3, 32, 32) if first else shapes[units[0] - 1]
    prune(model, units, first, last)
    num_classes = model.head.out_features if last else 1
    out_shape = (num_classes,) if last else shapes[units[-1]]
    wire = torch.bfloat16 if amp == "bf16" else torch.float32
    module = StageModule(model, units, first, last, autocast, wire)
    pipe = Pipeline(module, index, stages, device, microbatches, schedule, batch_size, in_shape, out_shape,
                    channels_last)
    pipe.split = record
    return pipe
