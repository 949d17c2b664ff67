"""What FSDP2 on CPU (gloo) needs on torch 2.6, the oldest supported release.

torch 2.7 first ran FSDP2 on CPU. On 2.6 three gaps remain, each closed here the way
2.7 closed it. The stream patches apply only where the stream lacks them; the gloo
average probe (one tiny collective at wrap time) runs on every release and changes
nothing where gloo averages.
"""
import torch
import torch.distributed as tdist
from torch.distributed.fsdp import MixedPrecisionPolicy


def patch_cpu_fsdp() -> None:
    """torch 2.6's stand-in CPU stream lacks record_event/wait_event, which FSDP2 calls on
    every device ("'Stream' object has no attribute 'record_event'"). 2.7 added both as
    no-ops: CPU work runs in issue order, and async collectives are waited on through
    their handles. The same release stopped the all-gather copy-out from bumping the
    unsharded parameters' version counters: on CPU (not CUDA, pytorch#132014) the copy
    counts as an in-place change, so the backward's re-gather of a resharded stage failed
    with "modified by an inplace operation"."""
    stream = torch.cpu.Stream
    if hasattr(stream, "record_event"):
        return
    stream.record_event = lambda self: None
    stream.wait_event = lambda self, event: None
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group
    group.foreach_all_gather_copy_out = _keeping_versions(group.foreach_all_gather_copy_out)  # pyright: ignore[reportPrivateImportUsage]  # patching torch's own name where FSDP2 looks it up


def _keeping_versions(copy_out):
    def copy_out_keeping_versions(result, fsdp_params, process_group):
        outputs = [t for p in fsdp_params for t in getattr(p, "all_gather_outputs", [])]
        versions = [t._version for t in outputs]
        copy_out(result, fsdp_params, process_group)
        for tensor, version in zip(outputs, versions):
            torch._C._autograd._unsafe_set_version_counter(tensor, version)  # pyright: ignore[reportAttributeAccessIssue]  # torch._C's stubs omit the _autograd module
    return copy_out_keeping_versions


def gloo_reduce_policy() -> MixedPrecisionPolicy:
    """FSDP2 averages fp32 gradients with a ReduceOp.AVG reduce-scatter. Gloo before
    pytorch#149781 accepts AVG and silently sums, which multiplies every gradient by the
    world size. Reducing in float64 makes FSDP2 take its SUM path with an explicit
    division (the one it uses for fp16): the same average, exactly."""
    if tdist.get_backend() != "gloo" or _gloo_reduce_scatter_averages():
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(reduce_dtype=torch.float64)


def _gloo_reduce_scatter_averages() -> bool:
    """One reduce-scatter of ones over the group (a collective: every rank asks)."""
    world = tdist.get_world_size()
    out = torch.zeros(1)
    reduce_scatter = getattr(tdist, "reduce_scatter_single", tdist.reduce_scatter_tensor)
    reduce_scatter(out, torch.ones(world), op=tdist.ReduceOp.AVG)
    return out.item() == 1.0
