"""NVTX ranges around DDP's gradient all-reduce: `allreduce b{k}` per bucket (DESIGN.md §4).

The hook wraps the default all-reduce, so gradients are exactly DDP's own. A bucket's
all-reduce completes on another thread (gloo's worker, or wherever the future resolves),
so the range is a start/end range, not push/pop. On gloo it covers launch to completion;
on NCCL the future resolves once the collective is enqueued on the stream, so the GPU time
is read from the NCCL kernels instead (handler/profiling/comm.py).
"""
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from handler.runtime import nvtx


def nvtx_allreduce_hook(process_group, bucket):
    from torch.cuda import nvtx as cuda_nvtx

    handle = cuda_nvtx.range_start(f"allreduce b{bucket.index()}")

    def finished(future):
        cuda_nvtx.range_end(handle)
        return future.value()

    return allreduce_hook(process_group, bucket).then(finished)


def add_allreduce_ranges(ddp_model):
    """Registers the hook only under a profiler: unprofiled runs keep DDP's built-in C++ all-reduce."""
    if nvtx.ACTIVE:
        ddp_model.register_comm_hook(None, nvtx_allreduce_hook)
    return ddp_model
