"""Keep freed memory inside CPU training processes instead of handing it back to the kernel.

PyTorch's CPU allocator is plain malloc/free. With glibc's defaults, large activation
buffers are fresh mmaps and the top of the heap is trimmed after frees, so every step
maps and zeroes its activations again: about 30,000 page faults and 10-25 % of a
resnet20 step on 2 cores (bench.overhead, docs/RESULTS.md). Raising both thresholds
to 1 GiB makes glibc reuse the memory. The cost: a process keeps its peak heap.

The environment wins: with MALLOC_* or GLIBC_TUNABLES set, or another allocator
preloaded, nothing is changed. HARNESS_GLIBC_DEFAULTS=1 keeps glibc's defaults, for
measuring the difference.
"""
import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BYTES = 1 << 30

_setting = None  # what this process's allocator runs with, for the metrics' env


def keep_freed_memory() -> str:
    """Apply the thresholds once per process; returns the setting in force."""
    global _setting
    if _setting is None:
        _setting = _apply()
    return _setting


def setting():
    return _setting


def _apply() -> str:
    if os.environ.get("HARNESS_GLIBC_DEFAULTS") == "1":
        return "glibc defaults (HARNESS_GLIBC_DEFAULTS=1)"
    configured = sorted(k for k in os.environ if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD"))
    if configured:
        return f"as set by {', '.join(configured)}"
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "platform default (no glibc mallopt)"
    if mallopt(M_TRIM_THRESHOLD, KEEP_BYTES) and mallopt(M_MMAP_THRESHOLD, KEEP_BYTES):
        return "glibc, trim and mmap thresholds 1 GiB"
    return "glibc defaults (mallopt refused the thresholds)"


def give_back_freed_arrays() -> str:
    """The report's opposite of keep_freed_memory: glibc keeps a freed block below its mmap
    threshold in the heap and raises the threshold to each large block freed, so the export
    reader's temporary columns stayed in the process (2 M kernels: peak 391 MB; 343 MB with the
    threshold fixed, handler/profiling/columns.py). Fixed at 4 MiB, every larger array goes back
    when freed; smaller chunks still reuse the heap. The environment wins, as above."""
    configured = sorted(k for k in os.environ if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD"))
    if configured:
        return f"as set by {', '.join(configured)}"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "platform default (no glibc mallopt)"
    return "glibc, mmap threshold 4 MiB" if mallopt(M_MMAP_THRESHOLD, 1 << 22) else "glibc defaults (mallopt refused)"
