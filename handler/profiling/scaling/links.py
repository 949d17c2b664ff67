"""The link the communication rides, and the bytes each step puts on it (docs/PROFILING.md, "The link").

A link is read from a report of 2 or more processes of the same machine: on GPUs its NCCL
kernel time per step (summary gpus[].nccl_kernel_s), on a CPU run its all-reduce ranges,
against the bytes the ring carried (the gradients, as the run's comm hook sends them). Where
no report gives one, it is assumed and said so: two GPU links, since the same 2-GPU box
may have either (P2P_LINK, THROUGH_HOST_LINK).
"""
import math
from dataclasses import dataclass

from handler.runtime.errors import UserError

from ..record.metrics import Metrics
from ..record.summary import CommConfig, Summary
from .comm_model import ring_messages, ring_share
from .step import Split

BETA = 1.0  # link efficiency: the shaped link carried 99 % of its rate (bench.comm, docs/COMM.md)
FIRST_BUCKET_MB, BUCKET_CAP_MB = 1.0, 25.0  # DDP's buckets: a small first one, then --bucket-cap-mb
FSDP_SHARE = 1.5  # fsdp's bytes a step over an all-reduce of its gradients (payload)


@dataclass(frozen=True)
class Link:
    """Rate in Gbit/s, latency in microseconds per ring message, and where they came from."""
    gbit: float
    latency_us: float
    source: str = "given"
    assumed: bool = False


P2P_LINK = Link(100.0, 10.0, "assumed: GPUs of one host talking peer to peer over PCIe (about 100 Gbit/s)", True)
# A rented 2-GPU box whose GPUs talk through host memory: its 2-GPU reports' NCCL kernels took 45-70 ms a
# step for ResNet-18's 44.7 MB, 5-8 Gbit/s (docs/PROFILING.md, "The link").
THROUGH_HOST_LINK = Link(8.0, 10.0, "assumed: GPUs talking through host memory (about 8 Gbit/s, as a "
                                    "rented 2-GPU box measured)", True)
CPU_LINK = Link(10.0, 50.0, "assumed: gloo over loopback TCP on one host", True)
# Between the nodes of a job, where its report measured no ring across them: a cluster's Ethernet, and
# beside it (the page's second column) an InfiniBand-class network.
NODE_LINK = Link(10.0, 50.0, "assumed: nodes joined by 10 Gbit/s Ethernet", True)
FAST_NODE_LINK = Link(100.0, 5.0, "assumed: nodes joined by 100 Gbit/s InfiniBand", True)
# MB each PowerSGD rank sends per step for each model of models/ (handler/DDP/powersgd.sent_numel; a test
# counts them): a low-rank P and Q per compressed gradient, the rest as it is.
POWERSGD_MB = {"resnet18": {1: 0.1837, 2: 0.329, 4: 0.6196, 8: 1.2046},
               "resnet20": {1: 0.0312, 2: 0.0568, 4: 0.108, 8: 0.2356},
               "fastnet": {1: 0.0688, 2: 0.1247, 4: 0.2366, 8: 0.4622}}


@dataclass(frozen=True)
class Payload:
    """What one step's communication carries: MB, buckets, collectives per bucket, and in words."""
    mb: float
    buckets: int
    per_bucket: int
    says: str


def payload(grad_mb: float, model: str | None, comm_config: CommConfig | None, buckets: int | None,
            mode: str | None = None) -> Payload:
    """The gradients as the run's comm hook sends them: fp16/bf16 half, PowerSGD its rank's share;
    fsdp (handler/FSDP/model.py: fully_shard, resharded after forward) gathers its fp32 parameters
    in forward and again in backward and reduce-scatters the gradients: each of the three carries
    half an all-reduce's bytes, so 1.5 times an all-reduce of the gradients."""
    config = comm_config or CommConfig()
    hook, cap = config.hook or "allreduce", config.bucket_cap_mb or BUCKET_CAP_MB
    count = buckets or default_buckets(grad_mb, cap)
    if mode == "fsdp":
        return Payload(grad_mb * FSDP_SHARE, count, 1, f"{grad_mb * FSDP_SHARE:.3g} MB (fsdp: parameters gathered "
                       f"twice and gradients reduce-scattered, 1.5 times an all-reduce of {grad_mb:.3g} MB)")
    if hook in ("fp16", "bf16"):
        return Payload(grad_mb / 2, count, 1, f"{grad_mb / 2:.3g} MB ({hook}: half of {grad_mb:.3g} MB)")
    if hook == "powersgd":
        rank = config.powersgd_rank or 2
        table = POWERSGD_MB.get(model or "")
        if not table or rank not in table:
            raise UserError(f"PowerSGD rank {rank} of model {model or 'unknown'}: its bytes are not in "
                            "handler/profiling/scaling/links.POWERSGD_MB; add them (a test counts them)")
        return Payload(table[rank], count, 3, f"{table[rank]:.3g} MB (PowerSGD rank {rank} of {grad_mb:.3g} MB)")
    return Payload(grad_mb, count, 1, f"{grad_mb:.3g} MB (fp32)")


def hook_of(metrics: Metrics | None) -> CommConfig | None:
    """The comm hook a run's metrics JSON names (its config holds every option), read without
    importing the modes (the lab page runs on a laptop without torch); None without one."""
    config = metrics.config if metrics else None
    if not config or not config.comm_hook:
        return None
    return CommConfig(hook=config.comm_hook, bucket_cap_mb=config.bucket_cap_mb, powersgd_rank=config.powersgd_rank)


def default_buckets(grad_mb: float, cap_mb: float) -> int:
    """DDP's buckets for grad_mb of gradients: the first of 1 MB, then cap_mb each; never more than one a
    gradient value (fp32: 4 bytes), however small the cap (1e-323 MB would be an infinity of buckets)."""
    rest = max(0.0, grad_mb - FIRST_BUCKET_MB)
    if not rest:
        return 1
    most, per = math.ceil(rest * 1e6 / 4), rest / cap_mb  # per: inf where the cap is too small to divide by
    return 1 + (math.ceil(per) if per < most else most)


def measured(split: Split, summary: Summary, sent: Payload, source: str) -> Link | None:
    """The link a report of 2 or more processes used: the ring's bytes over its communication time
    per step (NCCL kernels on GPUs, all-reduce ranges on a CPU run), after its messages' latency.
    None for a report of one process, or of one process driving every GPU, or without the time."""
    default = P2P_LINK if split.gpu else CPU_LINK
    n = split.devices if split.gpu else split.processes
    if n < 2 or split.processes < n or not split.gpu and not split.comm:
        return None
    if split.gpu:
        # the GPU whose NCCL kernels ran least: its rank arrived last, so they waited least for a peer
        nccl = min((g.nccl_kernel_s for g in summary.gpus or () if g.nccl_kernel_s), default=0.0)
        seconds = nccl / (split.steps_per_epoch * split.epochs)
    else:
        seconds = split.comm or 0.0
    if not seconds:
        return None
    latency = default.latency_us / 1e6 * ring_messages(n, sent.buckets, sent.per_bucket) / sent.buckets
    wire = seconds - latency
    if wire <= 0:
        return Link(math.inf, default.latency_us, f"{source}: latency-bound")
    return Link(ring_share(n) * sent.mb * 1e6 * 8 / wire / 1e9 * BETA, default.latency_us, source)


def parse_link(text: str) -> Link:
    try:
        gbit, latency = (float(v) for v in text.split(","))
    except ValueError:
        gbit = latency = -1.0
    if not (gbit > 0 and latency >= 0 and math.isfinite(gbit + latency)):
        raise UserError(f"--link {text!r} is not RATE,LATENCY or a .summary.json; write the rate in Gbit/s and "
                        "the latency in microseconds per message, e.g. --link 100,10, or pass the summary of a "
                        "report of 2 or more GPUs of the same machine")
    return Link(gbit, latency)
