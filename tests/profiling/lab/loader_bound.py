"""Real GPU exports reshaped as loader-bound runs, in our naming convention and in the kit's.

A loader-bound run's GPU idles while the loop waits for data. The copy gets its ranges the way
tests/nsys_helpers.with_training_ranges (ours) and kit_exports.with_kit_ranges (the kit's) put
them, then every range they added is stretched in time from its process's epoch start by
STRETCH: the real kernels and copies keep their times, so the GPU is busy about 1/STRETCH of
the epoch, and the wait fills the rest. Ours waits inside each `batch i` (the `data` phase,
70 % of it, as handler/train/loop.py fetches there); the kit's between its `Batch i` ranges.
"""
import sqlite3
from pathlib import Path

import tests.nsys_helpers as nsys_helpers
from tests.profiling.lab import kit_exports

STRETCH = 4
WAIT = 0.7  # of each step: the data phase (ours) or the gap between the steps (the kit's)
OURS_SPLIT = (("data", WAIT), ("h2d", 0.02), ("forward", 0.09), ("backward", 0.14), ("optimizer", 0.03))


def _added_since(target: Path) -> int:
    with sqlite3.connect(target) as db:
        return db.execute("SELECT COALESCE(MAX(rowid), 0) FROM NVTX_EVENTS").fetchone()[0]


def _stretch(target: Path, after: int, epoch_starts: dict) -> None:
    """Every NVTX row past `after`, of a process with an epoch start, stretched from that start."""
    db = sqlite3.connect(target)
    for pid, start in epoch_starts.items():
        db.execute("UPDATE NVTX_EVENTS SET start = ? + (start - ?) * ?, end = ? + (end - ?) * ? "
                   "WHERE rowid > ? AND ((globalTid >> 24) & 16777215) = ?",
                   (start, start, STRETCH, start, start, STRETCH, after, pid))
    db.commit()
    db.close()


def ours(source: Path, target: Path, monkeypatch) -> Path:
    """Our convention: `data` takes WAIT of each step, inside the step range."""
    monkeypatch.setattr(nsys_helpers, "PHASE_SPLIT", OURS_SPLIT)
    layout = nsys_helpers.with_training_ranges(source, target)
    after = _added_since(source)
    _stretch(target, after, {pid: e["epoch"][0] for pid, e in layout.items()})
    return target


def kit(source: Path, target: Path, monkeypatch) -> Path:
    """The kit's convention: the step range takes 1 - WAIT of each slot, the wait lies between."""
    monkeypatch.setattr(kit_exports, "INSIDE", 1 - WAIT)
    layout = kit_exports.with_kit_ranges(source, target)
    after = _added_since(source)
    _stretch(target, after, {pid: e["epoch"][0] for pid, e in layout.items()})
    return target
