"""The machine checks run before a GPU job starts, each one line naming the fix: what broke
students' runs on rented hosts. handler/train/preflight.py calls `check_machine`;
handler/DDP/utils.py's initialize_group names NCCL_P2P_DISABLE=1 when a start hangs
(`slow_start_warning`).

- a kernel runs on every GPU (a torch build without kernels for the GPU's architecture, such
  as an RTX 50xx with an older build, fails only at the first kernel);
- GPU<->GPU copies return what was sent, within a bound (peer-to-peer is broken on some hosts:
  DataParallel then trains on garbage and its loss goes NaN, or the copy hangs; NCCL may hang
  at start);
- /dev/shm is big enough for NCCL's shared-memory transport (a container's default 64 MB is not);
- the compute mode of each GPU the run uses (nvidia-smi's rows matched to the visible GPUs:
  handler/runtime/compute_modes.py): PROHIBITED refuses, EXCLUSIVE_PROCESS gets a note.
The launcher runs the GPU checks in a short-lived child process (`child_main`), so no CUDA
context of theirs outlives them (one per GPU held for a whole run, fatal where a GPU takes one
process only); a child that crashes is named as a crash, one silent past its bound as a hang.
Under torchrun each worker checks only its own GPU, after set_device. The GPU count is checked
where --num_gpu is parsed (handler/train/config.py).
"""
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, List, Optional, Tuple

from .compute_modes import Identity, bare_uuid, compute_mode_lines, run_gpus
from .cuda_build import smi_gpu_rows
from .errors import UserError

SHM_MIN_BYTES = 512 * 2**20
START_BOUND_S = 60.0
KERNELS_BOUND_S = 120.0  # the child's start (torch import) and a CUDA context per GPU
COPIES_BOUND_S = 30.0  # 4 MB each way per GPU pair: milliseconds where peer-to-peer works
EXIT_GRACE_S = 5.0  # a child that answered exits (CUDA teardown, nsys's flush) before it is killed
STDERR_TAIL_BYTES = 4096  # of a crashed child's stderr, for its last lines
ROOT = Path(__file__).resolve().parents[2]
CHILD = "import sys; from handler.runtime.machine import child_main; sys.exit(child_main(sys.argv[1:]))"
# The child's own lines start with this: anything else on its stdout (a sitecustomize banner, as
# clusters print on `module load`) is not the child speaking, and is passed over.
MARK = "harness-machine-check: "
DRAIN_S = 2.0  # after the child exited, for its last lines (a grandchild may hold the pipe open)
GO_ON = "HARNESS_ALLOW_BROKEN_PEERS"  # =1: train DataParallel over broken peer-to-peer anyway


def _cuda_kernel(index: int) -> float:
    import torch
    return float((torch.ones(8, device=f"cuda:{index}") * 2).sum().item())  # gpu-only: gpu_check row `dp`


def _cuda_identities(count: int) -> List[Identity]:
    """Each of GPUs 0..count-1 as torch sees them: (UUID, PCI bus id), for their nvidia-smi rows
    (handler/runtime/compute_modes.py); [] where torch cannot say (that module's fallback)."""
    import torch
    found: List[Identity] = []
    try:
        for index in range(count):
            props = torch.cuda.get_device_properties(index)  # gpu-only: gpu_check row `dp`
            pci = [int(getattr(props, f"pci_{part}_id", -1)) for part in ("domain", "bus", "device")]
            found.append((bare_uuid(str(getattr(props, "uuid", "") or "")),
                          (pci[0], pci[1], pci[2]) if min(pci) >= 0 else None))
    except (RuntimeError, AssertionError):  # torch asserts on a device id it does not see
        return []
    return found


def _cuda_copy(src: int, dst: int) -> bool:
    import torch
    sent = torch.arange(1 << 20, dtype=torch.float32, device=f"cuda:{src}")  # gpu-only: gpu_check row `2 GPUs: dp splits the batch`
    return bool(torch.equal(sent.to(f"cuda:{dst}").cpu(), sent.cpu()))


def check_kernels(count: int, run: Optional[Callable[[int], float]] = None, first: int = 0) -> None:
    """A small kernel on each of GPUs first..count-1 gives the right answer, or one line names the fix."""
    run = run or _cuda_kernel
    for index in range(first, count):
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
    return peer_trouble_line(mode, what, "DataParallel would train on garbage; use --mode ddp with NCCL_P2P_DISABLE=1",
                             "if the run hangs or its loss goes NaN, set NCCL_P2P_DISABLE=1")


def peer_trouble_line(mode: str, what: str, dp_fix: str, nccl_fix: str) -> str:
    """Peer-to-peer trouble refuses dp (unless HARNESS_ALLOW_BROKEN_PEERS=1: DataParallel copies
    between GPUs every step), and is one warning for the NCCL modes, which can turn it off."""
    if mode == "dp" and os.environ.get(GO_ON) != "1":
        raise UserError(f"{what}: {dp_fix}, or set {GO_ON}=1 to go on anyway")
    return f"warning: {what}; {nccl_fix}"


def hung_copies_line(mode: str, bound_s: float) -> str:
    """The one line for GPU<->GPU copies that passed their bound."""
    what = (f"GPU<->GPU copies did not finish within {bound_s:.0f} s (peer-to-peer hangs on this host; the usual "
            "cause is the IOMMU or PCIe ACS routing peer traffic through the CPU's root complex)")
    return peer_trouble_line(mode, what, "DataParallel would hang; use --mode ddp with NCCL_P2P_DISABLE=1, or turn off "
                                         "the IOMMU/ACS for peer-to-peer",
                             "NCCL would hang at start: set NCCL_P2P_DISABLE=1 (or turn off the IOMMU/ACS)")


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


def run_checks(count: int, mode: str, nccl: bool, say: Callable[[str], None] = lambda stage: None,
               ) -> List[str]:
    """The compute modes of the run's `count` GPUs (a PROHIBITED one refuses the run), kernels on
    them, then (2+) peer copies, and /dev/shm where `nccl`; the warnings and notes. UserError for a
    failure. `say` names each stage as it starts (the child's bound uses it)."""
    say("modes")
    note, refusal = compute_mode_lines(mode, *run_gpus(count, smi_gpu_rows(), _cuda_identities(count)))
    if refusal:
        raise UserError(refusal)
    say("kernels")
    check_kernels(count)
    warnings = [note]
    if count > 1:
        say("copies")
        warnings.append(check_peer_copies(count, mode))
        say("shm")
        if nccl:
            warnings.append(check_shm())
    return [line for line in warnings if line]


def checks_in_child(count: int, mode: str, nccl: bool) -> List[str]:
    """run_checks in a short-lived child process, bounded: the copies by COPIES_BOUND_S (a copy
    silent past it is the IOMMU/ACS hang, in one line), the rest by KERNELS_BOUND_S. A child that
    dies is named as a crash, with its signal or exit code and its last stderr lines; one that has
    answered is given EXIT_GRACE_S to exit. The warnings and notes; UserError."""
    cmd = [sys.executable, "-c", CHILD, str(count), mode, "nccl" if nccl else "-"]
    with tempfile.TemporaryFile("w+b") as errors:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
        silent = True  # a fault while reading: the child is ended at once
        try:
            stage, answer, silent = _child_answer(proc)
        finally:
            _end_child(proc, wait_s=0.0 if silent else EXIT_GRACE_S)
        if answer is None and stage == "copies":
            return [hung_copies_line(mode, COPIES_BOUND_S) if silent else peer_trouble_line(
                mode, _child_failure(stage, proc.returncode, stderr_tail(errors)),
                "DataParallel would crash the same way; use --mode ddp with NCCL_P2P_DISABLE=1",
                "NCCL's peer-to-peer may crash the same way: set NCCL_P2P_DISABLE=1")]
        if answer is None:
            raise UserError(_child_failure(stage, None if silent else proc.returncode, stderr_tail(errors)))
    if answer.get("error"):
        raise UserError(answer["error"])
    return answer.get("warnings", [])


def _child_answer(proc: "subprocess.Popen[str]") -> Tuple[str, Optional[dict], bool]:
    """Read the child's lines beside the clock: (the last stage it named, its answer or None,
    whether it fell silent past its stage's bound). Only its MARKed lines count. Its exit ends the
    wait, not the end of its output, which a grandchild it left behind may hold open."""
    out = proc.stdout
    assert out is not None  # PIPE
    said: "queue.Queue[str]" = queue.Queue()
    reader = threading.Thread(target=lambda: [said.put(line) for line in out], daemon=True)
    reader.start()
    stage, deadline, exited = "start", time.monotonic() + KERNELS_BOUND_S, None
    while True:
        try:
            text = said.get(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            if not reader.is_alive() and said.empty():
                return stage, None, False  # it closed its output: it ended without an answer
            if exited is None and proc.poll() is not None:
                exited = time.monotonic()
            if exited is not None and time.monotonic() - exited >= DRAIN_S:
                return stage, None, False  # it ended without an answer; its output is still held open
            if time.monotonic() >= deadline:
                return stage, None, True
            continue
        line = _marked(text)
        if line is None:
            continue
        if "stage" not in line:
            return stage, line, False
        stage = line["stage"]
        deadline = time.monotonic() + (COPIES_BOUND_S if stage == "copies" else KERNELS_BOUND_S)


def _marked(text: str) -> Optional[dict]:
    """The child's JSON on a MARKed line, else None (a banner, or a line cut short)."""
    if not text.startswith(MARK):
        return None
    try:
        line = json.loads(text[len(MARK):])
    except ValueError:
        return None
    return line if isinstance(line, dict) else None


def _end_child(proc: "subprocess.Popen[str]", wait_s: float) -> None:
    """Let the child exit within wait_s (its teardown matters under nsys), else kill its group."""
    try:
        proc.wait(timeout=wait_s or 0.01)
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass  # stuck in the driver: SIGKILL lands when the call returns


def stderr_tail(errors: IO[bytes], limit: int = STDERR_TAIL_BYTES, lines: int = 3) -> str:
    """The last `lines` non-empty lines within the last `limit` bytes of the child's stderr."""
    errors.seek(0, os.SEEK_END)
    errors.seek(max(0, errors.tell() - limit))
    said = [line.strip() for line in errors.read().decode(errors="replace").splitlines() if line.strip()]
    return " | ".join(said[-lines:])[-400:]


def _child_failure(stage: str, returncode: Optional[int], tail: str) -> str:
    """What happened to a child that gave no answer: silent past its bound (returncode None), or
    ended by a signal or an exit code: a crash, named with its last stderr lines. Outside the
    copies, the one line (with the advice) that stops the run."""
    where = "the GPU checks (a child process: handler/runtime/machine.py)"
    advice = "; run nvidia-smi to see whether the GPUs answer, or python -m bench.gpu --quick for a traceback"
    if returncode is None:
        return f"{where} did not finish within {KERNELS_BOUND_S:.0f} s in the {stage} stage{advice}"
    how = f"exited with code {returncode}"
    if returncode < 0:
        how = f"died of {signal.Signals(-returncode).name if -returncode in signal.valid_signals() else -returncode}"
    return f"{where} {how} in the {stage} stage ({tail or 'no stderr'})" + ("" if stage == "copies" else advice)


def child_main(argv: List[str]) -> int:
    """The child of `checks_in_child`: each stage as it starts, then the outcome, as JSON lines."""
    count, mode, nccl = int(argv[0]), argv[1], argv[2] == "nccl"

    def say(stage: str) -> None:
        print(MARK + json.dumps({"stage": stage}), flush=True)
    try:
        print(MARK + json.dumps({"warnings": run_checks(count, mode, nccl, say)}), flush=True)
    except UserError as err:
        print(MARK + json.dumps({"error": str(err)}), flush=True)
    return 0


def findings(count: int) -> List[str]:
    """Every check on `count` GPUs, in a child process, as the lines a run would print or stop
    with (scripts/gpu_check puts them in its report); empty when all pass."""
    try:
        return checks_in_child(count, "ddp", nccl=True)
    except UserError as err:
        return [str(err)]


def check_own_gpu(local_rank: int) -> None:
    """Under torchrun: this worker's GPU only, after set_device, in its own process (the context
    it trains in)."""
    import torch
    torch.cuda.set_device(local_rank)
    check_kernels(local_rank + 1, first=local_rank)


def check_machine(cfg, one_process: bool) -> None:
    """The checks a GPU run needs before it starts: kernels on every GPU; with 2+ GPUs, peer
    copies, and /dev/shm for the NCCL modes; the compute mode. Warnings and notes go to stderr;
    failures stop the run. Under torchrun, the worker's own GPU only."""
    if not cfg.use_cuda:
        return
    from .dist import launched_by_torchrun
    if launched_by_torchrun():
        check_own_gpu(int(os.environ["LOCAL_RANK"]))
        lines = [] if one_process else [check_shm()]
    else:
        lines = checks_in_child(cfg.num_gpu, cfg.mode, nccl=not one_process)
    for line in filter(None, lines):
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

