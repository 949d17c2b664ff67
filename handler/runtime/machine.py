"""The machine checks run before a GPU job starts, each one line naming the fix: what broke
students' runs on rented hosts. handler/train/preflight.py calls `check_machine`;
handler/DDP/utils.py's initialize_group names NCCL_P2P_DISABLE=1 when a start hangs
(`slow_start_warning`).

- a kernel runs on every GPU (a torch build without kernels for the GPU's architecture, such
  as an RTX 50xx with an older build, fails only at the first kernel);
- GPU<->GPU copies return what was sent (peer-to-peer is broken on some hosts: DataParallel
  then trains on garbage and its loss goes NaN; NCCL may hang at start);
- /dev/shm is big enough for NCCL's shared-memory transport (a container's default 64 MB is not).
The GPU count is checked where --num_gpu is parsed (handler/train/config.py).
"""
import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional

from .errors import UserError

SHM_MIN_BYTES = 512 * 2**20
START_BOUND_S = 60.0
GO_ON = "HARNESS_ALLOW_BROKEN_PEERS"  # =1: train DataParallel over broken peer-to-peer anyway


def _cuda_kernel(index: int) -> float:
    import torch
    return float((torch.ones(8, device=f"cuda:{index}") * 2).sum().item())  # gpu-only: gpu_check row `dp`


def _cuda_copy(src: int, dst: int) -> bool:
    import torch
    sent = torch.arange(1 << 20, dtype=torch.float32, device=f"cuda:{src}")  # gpu-only: gpu_check row `2 GPUs: dp splits the batch`
    return bool(torch.equal(sent.to(f"cuda:{dst}").cpu(), sent.cpu()))


def check_kernels(count: int, run: Optional[Callable[[int], float]] = None) -> None:
    """A small kernel on each of `count` GPUs gives the right answer, or one line names the fix."""
    run = run or _cuda_kernel
    for index in range(count):
        try:
            ok = run(index) == 16.0
            reason = "returned a wrong value"
        except RuntimeError as err:
            ok, reason = False, str(err).splitlines()[0][:120]
        if not ok:
            raise UserError(f"GPU {index} cannot run this torch's kernels ({reason}); install a torch build "
                            "for this GPU's architecture (bash scripts/setup.sh picks one; docs/GPU_CHECK.md)")


def check_peer_copies(count: int, mode: str, copy: Optional[Callable[[int, int], bool]] = None) -> str:
    """GPU 0 <-> every other GPU copies return what was sent. Broken copies refuse dp (unless
    HARNESS_ALLOW_BROKEN_PEERS=1) and give ddp a warning naming NCCL_P2P_DISABLE=1; returns that warning."""
    copy = copy or _cuda_copy

    def correct(a: int, b: int) -> bool:
        try:
            return copy(a, b)
        except RuntimeError:  # a copy that fails outright is as broken as a wrong one
            return False
    broken = [f"{a}->{b}" for b in range(1, count) for a, b in ((0, b), (b, 0)) if not correct(a, b)]
    if not broken:
        return ""
    what = f"GPU<->GPU copies {', '.join(broken)} return wrong values (peer-to-peer is broken on this host)"
    if mode == "dp" and os.environ.get(GO_ON) != "1":
        raise UserError(f"{what}: DataParallel would train on garbage; use --mode ddp with NCCL_P2P_DISABLE=1, "
                        f"or set {GO_ON}=1 to go on anyway")
    return f"warning: {what}; if the run hangs or its loss goes NaN, set NCCL_P2P_DISABLE=1"


def check_shm(path: str = "/dev/shm", min_bytes: Optional[int] = None) -> str:
    """A warning when `path` is smaller than NCCL's shared-memory transport needs (SHM_MIN_BYTES), else ""."""
    min_bytes = SHM_MIN_BYTES if min_bytes is None else min_bytes
    if os.environ.get("NCCL_SHM_DISABLE") == "1" or not os.path.isdir(path):
        return ""
    stat = os.statvfs(path)
    size = stat.f_blocks * stat.f_frsize
    if size >= min_bytes:
        return ""
    return (f"warning: {path} is {size // 2**20} MB, too small for NCCL's shared memory (the run may fail "
            "with 'unhandled system error'); set NCCL_SHM_DISABLE=1 or give the container --shm-size=1g")


def findings(count: int) -> List[str]:
    """Every check on `count` GPUs, as the lines a run would print or stop with (scripts/gpu_check
    puts them in its report); empty when all pass."""
    lines = []
    try:
        check_kernels(count)
    except UserError as err:
        lines.append(str(err))
    if count > 1:
        lines.append(check_peer_copies(count, "ddp"))
    lines.append(check_shm())
    return [line for line in lines if line]


def check_machine(cfg, one_process: bool) -> None:
    """The checks a GPU run needs before it starts: kernels on every GPU; with 2+ GPUs, peer
    copies, and /dev/shm for the NCCL modes. Warnings go to stderr; failures stop the run."""
    if not cfg.use_cuda:
        return
    check_kernels(cfg.num_gpu)
    warnings = []
    if cfg.num_gpu > 1:
        warnings.append(check_peer_copies(cfg.num_gpu, cfg.mode))
        if not one_process:
            warnings.append(check_shm())
    for line in filter(None, warnings):
        print(line, file=sys.stderr, flush=True)


@contextmanager
def slow_start_warning(bound_s: float = START_BOUND_S) -> Iterator[None]:
    """Say, once, when joining the process group takes longer than bound_s: on hosts with broken
    peer-to-peer NCCL hangs there, and NCCL_P2P_DISABLE=1 is the fix."""
    def warn():
        print(f"warning: the process group has not formed after {bound_s:.0f} s; if every rank is up, "
              "peer-to-peer may be broken on this host: rerun with NCCL_P2P_DISABLE=1", file=sys.stderr, flush=True)
    timer = threading.Timer(bound_s, warn)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
