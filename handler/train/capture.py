"""The profile's capture window: which epochs nsys records (docs/PROFILING.md, "Capture window").

A 30-epoch run profiled whole is millions of kernels in one report. Under nsys, launch.sh
asks for a capture range on one NVTX range (scripts/nsys_options.sh); this module opens that
range before the first captured epoch's own range and closes it after the last one, so the
report holds exactly those epochs and the rest of the run trains unprofiled.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..runtime.errors import UserError
from ..runtime import nvtx
from ..runtime.nvtx import capture_start, nvtx_mark, range_end

DEFAULT_WINDOW = (1, 2)  # after the first epoch's warm-up and autotuning
WHOLE_RUN_UP_TO = 3  # runs of at most this many epochs are captured whole


def parse_profile_epochs(spec: str, epochs: int) -> tuple[int, int] | None:
    """(first, last) epoch, inclusive; None for the whole run. `spec`: "" (the default), "all",
    "A:B" or "A"."""
    if spec == "":
        return DEFAULT_WINDOW if epochs > WHOLE_RUN_UP_TO else None
    if spec == "all":
        return None
    parts = spec.split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise UserError(f"--profile-epochs {spec!r} is not A:B or all; e.g. --profile-epochs 1:2 "
                        "(0-based epochs, inclusive)")
    first, last = int(parts[0]), int(parts[-1])
    if first > last or last >= epochs:
        raise UserError(f"--profile-epochs {spec}: the window must lie in epochs 0..{epochs - 1} with A <= B; "
                        f"e.g. --profile-epochs {min(1, epochs - 1)}:{min(2, epochs - 1)} or all")
    return first, last


def check_profile_epochs(spec: str, epochs: int) -> None:
    if epochs >= 1:  # --epochs itself is checked first
        parse_profile_epochs(spec, epochs)


def describe(window: tuple[int, int] | None, epochs: int) -> str:
    """"epochs 1-2 of 4" or "all 4 epochs": what the launch line and the metrics say."""
    if window is None:
        return f"all {epochs} epochs"
    first, last = window
    return f"epoch {first} of {epochs}" if first == last else f"epochs {first}-{last} of {epochs}"


@dataclass
class Capture:
    """Opens and closes the capture range around the window. A whole-run capture opens when
    the run starts and closes after its test; a window opens before its first epoch and closes
    after its last. Does nothing without a profiler."""
    window: tuple[int, int] | None
    marks: tuple[str, ...] = ()  # re-emitted inside the range: marks before it are not recorded
    handle: int | None = None

    @classmethod
    def start(cls, spec: str, epochs: int) -> "Capture":
        """At the start of the run, before its first NVTX mark. Without HARNESS_CAPTURE_WINDOW=1
        (scripts/nsys_options.sh use_capture_window) nsys records the whole run, and so does
        this window: its ranges must go on after epoch B."""
        window = parse_profile_epochs(spec, epochs)
        capture = cls(window if os.environ.get("HARNESS_CAPTURE_WINDOW") == "1" else None)
        if capture.window is None:
            capture._open()
        return capture

    def fit_to(self, start: int, stop: int) -> str | None:
        """Keep the window within the epochs this run trains ([start, stop): a resumed or
        --stop-after run). A window that misses them all captures the rest of the run instead,
        and the returned note says so."""
        if self.window is None:
            return None
        first, last = self.window
        if last < start or first >= stop:
            self.window = None
            self._open()
            return (f"--profile-epochs {first}:{last} lies outside epochs {start}-{stop - 1} that this run "
                    "trains: the rest of the run is captured instead")
        self.window = (max(first, start), min(last, stop - 1))
        return None

    def epochs(self, start: int, stop: int) -> list[int]:
        first, last = self.window if self.window is not None else (start, stop - 1)
        return list(range(first, last + 1))

    def before_epoch(self, epoch: int) -> None:
        if self.window is not None and epoch == self.window[0]:
            self._open()

    def after_epoch(self, epoch: int) -> None:
        if self.window is not None and epoch == self.window[1]:
            self._close()

    def close_run(self) -> None:
        self._close()

    def _open(self) -> None:
        if not nvtx.ACTIVE or self.handle is not None:
            return
        from ..runtime import dist  # torch.distributed: imported only by a profiled run
        # Every rank has opened its range before any rank starts the first captured epoch,
        # so no rank's epoch range begins before the capture does.
        self.handle = capture_start()
        dist.barrier()
        for mark in self.marks:
            nvtx_mark(mark)

    def _close(self) -> None:
        if self.handle is None:
            return
        from ..runtime import dist
        dist.barrier()  # every rank's last captured range has ended
        range_end(self.handle)
        self.handle = None
        nvtx.stop_ranges()
