"""Time per training phase from the loop's own clock, so phase shares need no profiler.

The comparison report prefers nsys's NVTX ranges; without nsys it plots these
(`epochs[].phase_s` in the metrics). The loop's `data` phase is the wait for the next
batch including its copy to the device; nsys splits that copy out as `h2d`.

- CPU: wall clock, which is the truth there.
- CUDA: events on the current stream, read once after the epoch's closing sync, so no
  step waits for a timer and the shares describe the GPU's timeline (a data wait hidden
  behind queued kernels costs the GPU nothing and counts as nothing).
"""
import time
from contextlib import nullcontext

import torch

LOOP_PHASES = ("data", "forward", "backward", "optimizer")


class PhaseTimer:
    """`with timer("forward"): ...` adds the block's duration to that phase."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._seconds = dict.fromkeys(LOOP_PHASES, 0.0)
        self._events = []  # CUDA only: (phase, start event, end event), read in seconds()

    def __call__(self, phase: str):
        return _CudaSpan(self, phase) if self._cuda else _WallSpan(self, phase)

    def seconds(self) -> dict:
        """Seconds per phase so far; on CUDA the caller has synchronised the device."""
        for phase, start, end in self._events:
            self._seconds[phase] += start.elapsed_time(end) / 1000.0  # gpu-only: tests/machine/test_gpu.py::test_cuda_event_phase_timers_add_up_to_the_epochs_wall_time
        self._events.clear()
        return dict(self._seconds)


def no_timer(phase: str):
    """The timer for callers that time nothing (benchmarks, tests of the step alone)."""
    return _NULL


_NULL = nullcontext()


class _WallSpan:
    __slots__ = ("timer", "phase", "start")

    def __init__(self, timer, phase):
        self.timer, self.phase = timer, phase

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.timer._seconds[self.phase] += time.perf_counter() - self.start


class _CudaSpan:  # gpu-only: tests/machine/test_gpu.py::test_cuda_event_phase_timers_add_up_to_the_epochs_wall_time
    __slots__ = ("timer", "phase", "start")

    def __init__(self, timer, phase):
        self.timer, self.phase = timer, phase

    def __enter__(self):
        self.start = torch.cuda.Event(enable_timing=True)
        self.start.record()

    def __exit__(self, *exc):
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.timer._events.append((self.phase, self.start, end))
