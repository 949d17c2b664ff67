"""NVTX ranges for Nsight Systems, free when no profiler is attached.

Every range and mark of the harness is opened here, under a name from handler/runtime/names.py
(the loop's phases through handler/runtime/phases.py, which also times them). Profilers
announce themselves through the environment of the process they inject into; without one
every range is one shared no-op context manager. torch.cuda.nvtx is used because this nsys
captures it on CPU-only runs too.
"""
import os
from contextlib import nullcontext

from .names import CAPTURE

_NULL = nullcontext()
# How profilers announce themselves in a process they inject into: nsys sets the first two
# (the second when it traces NVTX), CUPTI-based tools the last.
PROFILER_ENV = ("NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")


def profiler_attached() -> bool:
    """The one test for a profiler: it decides whether ranges are on and how ranks start
    (handler/DDP/utils.py start_method)."""
    return any(os.environ.get(name) for name in PROFILER_ENV)


# Ranges on: under a profiler, or forced (HARNESS_NVTX=1, for bench/ to measure their cost).
ACTIVE = profiler_attached() or os.environ.get("HARNESS_NVTX") == "1"

if ACTIVE:
    from torch.cuda import nvtx as _nvtx


class _Range:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _nvtx.range_push(self.name)

    def __exit__(self, *exc):
        _nvtx.range_pop()


def nvtx_range(name: str):
    """`with nvtx_range(names.EPOCH(e)): ...` marks exactly the work inside the block."""
    return _Range(name) if ACTIVE else _NULL


def push(name: str) -> bool:
    """Open a push/pop range when ranges are on; True if it was opened (the caller pops it)."""
    if ACTIVE:
        _nvtx.range_push(name)
        return True
    return False


def pop() -> None:
    _nvtx.range_pop()


def nvtx_mark(text: str) -> None:
    if ACTIVE:
        _nvtx.mark(text)


def range_start(name: str) -> int | None:
    """A start/end range, not on the push/pop stack: it may end on another thread or outlive
    the range that was open when it started. None when ranges are off."""
    if not ACTIVE:
        return None
    from torch.cuda import nvtx as cuda_nvtx
    return cuda_nvtx.range_start(name)


def range_end(handle: int | None) -> None:
    if handle is not None:
        from torch.cuda import nvtx as cuda_nvtx
        cuda_nvtx.range_end(handle)


def capture_start() -> int | None:
    """Open the capture range (scripts/nsys_options.sh --nvtx-capture): a start/end range, so
    that it can span epochs (push/pop ranges form a stack and would end with the epoch that
    pushed it). Closed by range_end."""
    return range_start(CAPTURE)


def stop_ranges() -> None:
    """No more NVTX from this process: called when the capture window closes. nsys records
    for a while after the capture range ends (over a second on a loaded machine), so ranges
    opened then would put part of the next epoch into the report; the rest of the run trains
    without them, as unprofiled."""
    global ACTIVE
    ACTIVE = False
