"""Measured cost of each block, for `--pp-split time` (docs/MODES.md).

Rank 0 runs a copy of the model piece by piece on the run's own device, micro-batch,
precision and memory format, timing each piece's forward and backward. The copy keeps
the real model's BatchNorm statistics and the global RNG untouched, so a timed run
trains exactly as an untimed one. The stem's cost counts with the first block and the
head's (with the loss) with the last, where they run.

Timings are cached in a small JSON file (CKPT/pp_timing.json), keyed by everything that
changes them, so a resumed or repeated run does not time again.
"""
import copy
import json
import os
import platform
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from .stages import blocks, model_stages

CACHE_NAME = "pp_timing.json"
# Each piece's fastest of the timed passes, after 1 untimed one (allocator, autotuning):
# other work on the machine only ever adds time, so the minimum is the piece's own cost.
# At least 3 passes, more while they fit in a second (small models: noise is relatively larger).
WARMUP, REPEATS, MAX_REPEATS, BUDGET_S = 1, 3, 20, 1.0


def device_name(device: torch.device) -> str:
    if device.type == "cuda":  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[pp]
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def cache_key(model_name: str, micro_batch: int, device: torch.device, amp: str, channels_last: bool,
              checkpointed: bool) -> str:
    """Everything that changes a block's time, as one string."""
    return json.dumps({"model": model_name, "micro_batch": micro_batch, "device": device_name(device),
                       "torch": torch.__version__, "amp": amp, "channels_last": channels_last,
                       "activation_checkpointing": checkpointed}, sort_keys=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[pp]
        torch.cuda.synchronize(device)


def _clock(device: torch.device) -> Callable[[], float]:
    """GPU: wall time after a synchronise. CPU: the process's CPU time, which other
    processes taking the core do not inflate (wall time does, and more for long blocks
    than for short ones, since a short one more often runs untouched: on a loaded machine
    that biased the cut toward the first stage)."""
    return time.perf_counter if device.type == "cuda" else time.process_time


def _pieces(model: nn.Module) -> List[Callable[..., torch.Tensor]]:
    """stem, every block (as a one-block slice of its stage: it keeps the stage's class,
    activation checkpointing included), head with the loss."""
    def head(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(cast(Any, model).forward_head(x).float(), labels)
    stages = model_stages(model)
    return [cast(nn.Module, model.stem), *(stages[i][j:j + 1] for i, j in blocks(model)), head]


def _one_pass(pieces, images, labels, autocast, device) -> Tuple[List[float], List[float]]:
    """Seconds of forward and of backward per piece, each piece in its own graph."""
    fwd, bwd, saved = [], [], []
    clock = _clock(device)
    x = images
    for k, piece in enumerate(pieces):
        x = x.detach().requires_grad_(k > 0)
        _sync(device)
        start = clock()
        with autocast():
            out = piece(x, labels) if k == len(pieces) - 1 else piece(x)
        _sync(device)
        fwd.append(clock() - start)
        saved.append((x, out))
        x = out
    grad = None
    for x, out in reversed(saved):
        _sync(device)
        start = clock()
        out.backward(grad)
        _sync(device)
        bwd.append(clock() - start)
        grad = x.grad
    return fwd, bwd[::-1]


def time_blocks(model: nn.Module, micro_batch: int, autocast, channels_last: bool) -> Dict[str, List[float]]:
    """Milliseconds of forward and of backward per block for one micro-batch (the stem
    added to the first block, the head and loss to the last)."""
    device = next(model.parameters()).device
    twin = copy.deepcopy(model).train()
    g = torch.Generator(device=device).manual_seed(0)
    images = torch.randn(micro_batch, 3, 32, 32, generator=g, device=device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (micro_batch,), generator=g, device=device)
    pieces = _pieces(twin)
    for _ in range(WARMUP):
        _one_pass(pieces, images, labels, autocast, device)
    runs, start = [], time.perf_counter()
    while len(runs) < REPEATS or (len(runs) < MAX_REPEATS and time.perf_counter() - start < BUDGET_S):
        runs.append(_one_pass(pieces, images, labels, autocast, device))
    result = {}
    for name, which in (("fwd_ms", 0), ("bwd_ms", 1)):
        ms = [1e3 * min(run[which][k] for run in runs) for k in range(len(pieces))]
        ms[1] += ms[0]
        ms[-2] += ms[-1]
        result[name] = ms[1:-1]
    return result


class TimingCache:
    """{key: timings} in one JSON file, written atomically. A file that cannot be read or
    written is said (`problem`), never fatal: the run then times afresh or keeps the
    timing in memory."""

    def __init__(self, path: Optional[str]):
        self.path, self.problem = path, ""

    def _read(self) -> Dict[str, Any]:
        if not self.path or not os.path.exists(self.path):
            return {}
        try:
            with open(self.path) as f:
                data = json.load(f)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return data
        except (OSError, ValueError) as exc:
            self.problem = f"unreadable timing cache {self.path} ({exc}); timed afresh"
            return {}

    def get(self, key: str) -> Optional[Dict[str, List[float]]]:
        return self._read().get(key)

    def put(self, key: str, value: Dict[str, List[float]]) -> None:
        if not self.path:
            return
        data = {**self._read(), key: value}
        tmp = f"{self.path}.tmp{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as exc:
            self.problem = f"could not write the timing cache {self.path} ({exc}); the next run times again"
