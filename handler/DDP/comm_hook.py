"""DDP's gradient exchange: which hook runs, and the `allreduce b{k}` ranges around it
(docs/PROFILING.md and docs/COMM.md).

The hooks are torch's own (ddp_comm_hooks): plain all-reduce, fp16/bf16 compression (cast,
all-reduce, cast back) and PowerSGD (handler/DDP/powersgd.py keeps its state resumable).
A bucket's exchange completes on another thread (gloo's worker, or wherever the future
resolves), so its range is a start/end range, not push/pop, opened before the hook and
closed when the hook's future completes: compression and decompression lie inside it.
On gloo the range covers launch to completion; on NCCL the future resolves once the
collective is enqueued, so the GPU time is read from the NCCL kernels instead
(handler/profiling/comm.py).
"""
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (allreduce_hook, bf16_compress_hook,
                                                                       fp16_compress_hook)

from handler.runtime import nvtx
from handler.runtime.names import ALLREDUCE
from handler.runtime.errors import UserError

from .options import CommOptions

if TYPE_CHECKING:
    from .powersgd import PowerSGD

CASTS = {"fp16": (fp16_compress_hook, torch.float16), "bf16": (bf16_compress_hook, torch.bfloat16)}


class NvtxRanges:
    """`allreduce b{k}` as nsys sees it; start is None once the profile's capture window has
    closed (handler/runtime/nvtx.py stop_ranges)."""
    start = staticmethod(nvtx.range_start)
    end = staticmethod(nvtx.range_end)


def in_ranges(hook, ranges):
    """hook(state, bucket) with the bucket's exchange, compression included, inside a range."""
    def ranged_hook(state, bucket):
        handle = ranges.start(ALLREDUCE(bucket.index()))

        def finished(future):
            ranges.end(handle)
            return future.value()
        return hook(state, bucket).then(finished)
    return ranged_hook


@dataclass
class CommHook:
    """The run's CommOptions (handler/DDP/options.py), as they are; `register` attaches them to a DDP model."""
    options: CommOptions = field(default_factory=CommOptions)
    seed: int = 0
    powersgd: Optional["PowerSGD"] = field(default=None, repr=False)  # once registered

    @classmethod
    def from_config(cls, cfg) -> "CommHook":
        return cls(CommOptions.of(cfg), seed=cfg.seed)

    @property
    def name(self) -> str:
        return self.options.comm_hook

    def ddp_options(self) -> dict:
        o = self.options
        return {"bucket_cap_mb": o.bucket_cap_mb, "static_graph": o.static_graph,
                "gradient_as_bucket_view": o.grad_as_bucket_view}

    def register(self, ddp, ranges=None, group=None):
        """Attach the hook; `ranges` (start/end) marks each bucket, by default NVTX under a profiler.
        Unprofiled plain all-reduce keeps DDP's built-in C++ path: no Python hook at all.
        `group`: the process group `ddp` was built on (None: the default one). Registered
        again on a new DDP model over the same module, PowerSGD keeps its state (step count,
        error feedback) and moves to the new group."""
        ranges = ranges or (NvtxRanges if nvtx.ACTIVE else None)
        if self.name == "allreduce" and ranges is None:
            return ddp
        if self.name == "powersgd":
            if self.powersgd is None:
                from .powersgd import PowerSGD
                self.powersgd = PowerSGD(ddp.module, self.options.powersgd_rank, self.options.powersgd_warmup,
                                         self.seed)
            self.powersgd.state.process_group = group
            state, hook = self.powersgd.state, self.powersgd.hook
        elif self.name in CASTS:
            hook, dtype = CASTS[self.name]
            check_backend_carries(dtype, self.name)
            state = group
        else:
            state, hook = group, allreduce_hook
        ddp.register_comm_hook(state, in_ranges(hook, ranges) if ranges else hook)
        return ddp

    def state_dict(self) -> Optional[dict]:
        """What a checkpoint keeps of the hook (PowerSGD only). A collective: every rank calls it."""
        return self.powersgd.state_dict() if self.powersgd else None

    def load_state_dict(self, saved: Optional[dict], say) -> None:
        if self.powersgd:
            self.powersgd.load_state_dict(saved, say)
        elif saved:
            say(f"note: the checkpoint's {saved.get('name')} state is not used with --comm-hook {self.name}")


def check_backend_carries(dtype: torch.dtype, hook: str) -> None:
    """One all-reduce of a single element in `dtype`: a backend that cannot carry it (gloo
    before half-precision support) fails here in one line, not inside backward."""
    probe = torch.ones(1, dtype=dtype, device="cuda" if tdist.get_backend() == "nccl" else "cpu")
    try:
        tdist.all_reduce(probe)
    except RuntimeError as err:
        raise UserError(f"--comm-hook {hook}: the {tdist.get_backend()} backend cannot all-reduce {dtype} "
                        f"({str(err).splitlines()[0][:120]}); use --comm-hook powersgd or allreduce") from None
