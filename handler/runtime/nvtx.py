"""NVTX ranges for Nsight Systems, free when no profiler is attached.

nsys (and other NVTX tools) announce themselves through NVTX_INJECTION64_PATH in the
profiled process; without it every range is one shared no-op context manager.
torch.cuda.nvtx is used because this nsys captures it on CPU-only runs too.
"""
import os
from contextlib import nullcontext

_NULL = nullcontext()
# How profilers announce themselves in a process they inject into: nsys sets the first two,
# CUPTI-based tools the last.
PROFILER_ENV = ("NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")


def profiler_attached() -> bool:
    return any(os.environ.get(name) for name in PROFILER_ENV)


ACTIVE = bool(os.environ.get("NVTX_INJECTION64_PATH")) or os.environ.get("HARNESS_NVTX") == "1"

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
    """`with nvtx_range("forward"): ...` marks exactly the work inside the block."""
    return _Range(name) if ACTIVE else _NULL


def nvtx_mark(text: str) -> None:
    if ACTIVE:
        _nvtx.mark(text)


# The NVTX range whose span nsys records when launch.sh asks for a capture range
# (--nvtx-capture in scripts/nsys_options.sh); opened and closed by handler/train/capture.py.
CAPTURE_RANGE = "harness_capture"


def capture_start() -> int | None:
    """Open the capture range: a start/end range, not a push, so that it can span epochs
    (push/pop ranges form a stack and would end with the epoch that pushed it)."""
    return _nvtx.range_start(CAPTURE_RANGE) if ACTIVE else None


def capture_end(handle: int | None) -> None:
    if handle is not None:
        _nvtx.range_end(handle)


def stop_ranges() -> None:
    """No more NVTX from this process: called when the capture window closes. nsys records
    for a while after the capture range ends (over a second on a loaded machine), so ranges
    opened then would put part of the next epoch into the report; the rest of the run trains
    without them, as unprofiled."""
    global ACTIVE
    ACTIVE = False
