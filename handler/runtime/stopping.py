"""Graceful stop: SIGINT/SIGTERM end training at a step boundary every rank agrees on.

A signal only sets a flag. Each step, ranks exchange their flags with an async
all-reduce on a small gloo group and act on the previous step's result, so every rank
stops after the same step (a rank stopping alone would hang the others in DDP's
all-reduce) and the GPU stream is never synchronised for it.
"""
import signal
import sys
from contextlib import contextmanager

import torch
import torch.distributed as tdist

from . import dist
from .errors import StopRequested

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received = 0  # the first stop signal this process got, for the heartbeat (handler/DDP/peers.py)


def received() -> int:
    """The stop signal this process got (0: none). A rank whose launcher is ending it has
    nothing to add about peers that vanish meanwhile: the launcher's cause explains it."""
    return _received


@contextmanager
def quiet_once_ended():
    """A rank its launcher is ending (a stop signal received, the graceful stop not reached)
    exits with 128 + that signal and no traceback, whatever breaks meanwhile: its loader
    workers are ended with it (the DataLoader then raises "worker ... killed by signal") and
    its connections close under it. The launcher's line explains the stop."""
    try:
        yield
    except Exception as err:
        if not _received or isinstance(err, StopRequested):
            raise
        sys.exit(128 + _received)


class StopFlag:
    def __init__(self):
        self.signum = 0
        self._group = dist.cpu_group() if dist.active() else None
        self._pending = None
        self._buffer = torch.zeros(1)
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}

    def _on_signal(self, signum, frame):
        global _received
        self.signum = self.signum or signum
        _received = _received or signum

    def should_stop(self) -> bool:
        """Call once per step on every rank; answers the same on every rank."""
        if self._group is None:
            return self.signum != 0
        agreed = False
        if self._pending is not None:
            self._pending.wait()
            agreed = self._buffer.item() > 0
        self._buffer = torch.tensor([float(self.signum)])
        self._pending = tdist.all_reduce(self._buffer, group=self._group, async_op=True)
        return agreed

    def agreed_signal(self) -> signal.Signals:
        """The signal to report once stopped: ours, or SIGTERM when a peer got it."""
        return signal.Signals(self.signum or signal.SIGTERM)

    def close(self) -> None:
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
