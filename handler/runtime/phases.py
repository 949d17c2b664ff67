"""The training phases: `with phase(FORWARD): ...` opens the phase's NVTX range and times it.

One context manager does both, so the profile and the loop's own clock always cover the same
work under the same name (handler/runtime/names.py). The comparison report prefers nsys's
ranges; without nsys it plots these timers (`epochs[].phase_s` in the metrics). The loop's
`data` phase is the wait for the next batch including its copy to the device; nsys shows that
copy as the `h2d` range nested inside it, and the profile report counts it as `h2d` only.

- CPU: wall clock, which is the truth there.
- CUDA: events on the current stream, read once after the epoch's closing sync, so no
  step waits for a timer and the shares describe the GPU's timeline (a data wait hidden
  behind queued kernels costs the GPU nothing and counts as nothing). The host's own wall
  clock runs beside them: `waited()`, the time the loop waited for batches.

Every phase entered also moves this rank's `HERE` (epoch, step, phase, since when), which the
DDP heartbeat publishes so that a rank the others wait on is named with its phase
(handler/DDP/peers.py).
"""
import time
from typing import Callable, ContextManager

import torch

from . import nvtx
from .names import CHECKPOINT, DATA, LOOP_PHASES, PHASES, TEST, VALIDATE

Phase = Callable[[str], ContextManager]  # PhaseTimer, or untimed
STARTUP = "start-up"  # before the first epoch: building the model, the loaders, DDP's first broadcast
# Where a rank can be, in the order it passes them: a step's phases, then the epoch's validation
# and checkpoint; the test set after the last epoch.
STAGES = (STARTUP, *PHASES, VALIDATE, CHECKPOINT, TEST)


class Position:
    """Where a rank's loop is: epoch, step, phase, and since when (wall clock, so another
    host can tell how long)."""
    __slots__ = ("epoch", "step", "phase", "since")

    def __init__(self, epoch: int = -1, step: int = 0, phase: str = STARTUP, since: float = 0.0):
        self.epoch, self.step, self.phase, self.since = epoch, step, phase, since or time.time()

    def text(self) -> str:
        return f"{self.epoch} {self.step} {self.phase} {self.since:.3f}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        epoch, step, phase, since = text.split()
        return cls(int(epoch), int(step), phase, float(since))

    def order(self) -> tuple:
        """Sorts as the loop passes positions: a step's phases share its number, validation
        and the checkpoint come after the epoch's last step, the test after the last epoch."""
        stage = STAGES.index(self.phase) if self.phase in STAGES else 0
        if self.phase in PHASES:
            return self.epoch, 0, self.step, stage
        return (self.epoch if self.phase != TEST else float("inf")), stage, 0, 0

    def __str__(self) -> str:
        if self.phase == STARTUP:
            return f"'{STARTUP}'"
        step = f" step {self.step}" if self.phase in PHASES else ""
        return f"'{self.phase}' at epoch {self.epoch}{step}"


HERE = Position()  # this process's rank


def entered(phase: str) -> None:
    HERE.phase, HERE.since = phase, time.time()


def at_step(epoch: int, step: int) -> None:
    HERE.epoch, HERE.step = epoch, step


class PhaseTimer:
    """`with timer(FORWARD): ...`: the phase's NVTX range, and the block's duration added to it."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._host: dict[str, float] = dict.fromkeys(LOOP_PHASES, 0.0)  # wall seconds per phase
        self._device: dict[str, float] = dict.fromkeys(LOOP_PHASES, 0.0)  # CUDA only: seconds from the events
        self._events = []  # CUDA only: (phase, start event, end event), read in seconds()

    def __call__(self, phase: str):
        return _CudaSpan(self, phase) if self._cuda else _WallSpan(self, phase)

    def seconds(self) -> dict:
        """Seconds per phase so far; on CUDA the caller has synchronised the device."""
        if not self._cuda:
            return dict(self._host)
        for phase, start, end in self._events:
            self._device[phase] += start.elapsed_time(end) / 1000.0  # gpu-only: tests/machine/test_gpu.py::test_cuda_event_phase_timers_add_up_to_the_epochs_wall_time
        self._events.clear()
        return dict(self._device)

    def waited(self) -> float:
        """Host seconds spent in `data`: the metrics' data_wait_s."""
        return self._host[DATA]


def untimed(phase: str) -> ContextManager:
    """The phase for callers that time nothing (benchmarks, tests of the step alone): its
    NVTX range only."""
    return nvtx.nvtx_range(phase)


class _WallSpan:
    __slots__ = ("timer", "phase", "start", "ranged")

    def __init__(self, timer: PhaseTimer, phase: str):
        self.timer, self.phase = timer, phase

    def __enter__(self):
        entered(self.phase)
        self.ranged = nvtx.push(self.phase)
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.timer._host[self.phase] += time.perf_counter() - self.start
        if self.ranged:
            nvtx.pop()


class _CudaSpan(_WallSpan):  # gpu-only: tests/machine/test_gpu.py::test_cuda_event_phase_timers_add_up_to_the_epochs_wall_time
    __slots__ = ("event",)

    def __enter__(self):
        super().__enter__()
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def __exit__(self, *exc):
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.timer._events.append((self.phase, self.event, end))
        super().__exit__(*exc)
