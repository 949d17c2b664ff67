"""A lost peer ends the run well within --dist-timeout, and is named.

Every rank beats a counter in the rendezvous store twice a second, on a connection of its
own, and watches its ring neighbours' counters. A neighbour silent for `silent_after`
(a third of --dist-timeout, at least 3 s) is lost: this rank names it and exits, whatever
collective it is blocked in (some block with no timeout of their own). The limit sits well
inside the collective's timeout, so a rank stopped just after a beat (SIGSTOP, a debugger,
a swapped-out host) is named before any collective gives up on it. A collective that fails
first (a closed connection) is turned into the same one line: the counters that stood still
name the lost ranks, and dist.HOSTS their hosts. When the store itself does not answer,
rank 0 (which serves it) or its host is lost. Every store call is bounded (store_link.py):
one to a store that is cut off fails after STORE_TIMEOUT_S instead of hanging the thread.
The failing rank dumps its Flight Recorder (flight_recorder.py) and says where.
"""
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import List, Optional

import torch.distributed as tdist

from ..runtime import dist
from ..runtime.errors import UserError
from . import flight_recorder
from .store_link import BoundedStore

BEAT_S = 0.5
MIN_SILENCE_S = 3.0  # a few missed beats under load are not a lost peer
STORE_TIMEOUT_S = 5.0
KEY = "harness/beat/{}"
# What torch's gloo and NCCL errors say when a peer is gone or silent.
COMM_FAILURE = ("Timed out", "timed out", "Connection", "connection", "closed by peer", "Broken pipe",
                "NCCL", "Gloo", "gloo")
_reported = threading.Event()  # one line per process, from the watcher or from the failed collective


def _client(host: str, port: int) -> Optional[BoundedStore]:
    """A store connection of our own whose calls end within STORE_TIMEOUT_S, or None when
    the store does not answer (refuses the connection, or accepts it and then stays silent)."""
    try:
        return BoundedStore(host, port, STORE_TIMEOUT_S)
    except (OSError, tdist.DistError):
        return None


def silent_after(timeout_s: float) -> float:
    """How long a peer may stay silent before it is lost: a third of the collective's
    timeout, so the heartbeat names a silent peer before the collective gives up on it."""
    return max(MIN_SILENCE_S, timeout_s / 3)


def describe(ranks) -> str:
    return ", ".join(f"rank {r} ({dist.HOSTS.get(r, '?')})" for r in ranks)


def store_lost(host: str, port: int, why: str) -> str:
    gone = [r for r, h in sorted(dist.HOSTS.items()) if h == dist.HOSTS.get(0)] or [0]
    return f"lost {describe(gone)}: the rendezvous store on {host}:{port} does not answer ({why})"


class Heartbeat:
    """Beats this rank's counter and watches its neighbours' (a thread; close() stops it).

    close() waits for the thread: a thread still inside a store call when the process exits
    aborts it (SIGABRT, "terminate called without an active exception") if the store drops
    the call then, as it does when rank 0 ends first. Every call is bounded, so the wait is.
    """

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float):
        self.host, self.port, self.rank, self.timeout_s = host, port, rank, timeout_s
        self.limit_s = silent_after(timeout_s)
        self.peers = sorted({(rank - 1) % world, (rank + 1) % world} - {rank})
        self._stop = threading.Event()
        self._link: Optional[BoundedStore] = None
        self._thread = threading.Thread(target=self._run, name="harness-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._beat()
        finally:
            if self._link is not None:
                self._link.close()

    def _beat(self) -> None:
        counts, silent_since = {}, None
        heard = {p: time.monotonic() for p in self.peers}
        while not self._stop.wait(BEAT_S):
            now = time.monotonic()
            try:
                self._link = self._link or _client(self.host, self.port)
                if self._link is None:
                    raise OSError("no store")
                self._link.add(KEY.format(self.rank), 1)
                for p in self.peers:
                    count = self._link.add(KEY.format(p), 0)
                    if counts.get(p) != count:
                        counts[p], heard[p] = count, now
                silent_since = None
            except Exception:  # noqa: BLE001 - unreachable for now: a cut link may heal
                if self._link is not None:
                    self._link.close()
                self._link, silent_since = None, silent_since or now
            if self._stop.is_set():
                return
            limit = f"no heartbeat for {round(self.limit_s, 2):g} s (--dist-timeout {self.timeout_s:g} s)"
            if silent_since is not None and now - silent_since > self.limit_s:
                self._give_up(store_lost(self.host, self.port, limit))
            lost = [p for p in self.peers if now - heard[p] > self.limit_s]
            if silent_since is None and lost:
                self._give_up(f"lost {describe(lost)}: {limit}")

    def _give_up(self, message: str) -> None:
        """The main thread may be blocked in C++ for good: say it here and end the process."""
        if self._stop.is_set() or _reported.is_set():
            return
        _reported.set()
        dump = flight_recorder.dump(self.rank)
        print(f"rank {self.rank} ({socket.gethostname()}): {message}; the other ranks stop too"
              f"{'; ' + dump if dump else ''}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)

    def close(self, wait_s: float) -> None:
        """Stop beating; return once the thread has ended. A call in flight is left wait_s to
        end by itself (dropping it makes torch log a C++ backtrace), then dropped."""
        self._stop.set()
        self._thread.join(timeout=wait_s)
        link = self._link
        if self._thread.is_alive() and link is not None:
            link.close()
        self._thread.join(timeout=STORE_TIMEOUT_S)


def lost_ranks(host: str, port: int, rank: int, world: int) -> Optional[List[int]]:
    """Ranks whose beat stopped (never this one); None when the store does not answer."""
    store = _client(host, port)
    if store is None:
        return None
    try:
        before = [store.add(KEY.format(r), 0) for r in range(world)]
        time.sleep(3 * BEAT_S)
        after = [store.add(KEY.format(r), 0) for r in range(world)]
    except Exception:  # noqa: BLE001 - unreachable, refused or timed out: all mean "gone"
        return None
    finally:
        store.close()
    return [r for r in range(world) if r != rank and after[r] == before[r]]


def is_comm_failure(err: BaseException) -> bool:
    return isinstance(err, tdist.DistError) or (
        isinstance(err, RuntimeError) and any(s in str(err) for s in COMM_FAILURE))


@contextmanager
def watch(host: str, port: int, rank: int, world: int, timeout_s: float):
    """Beat and watch while the block runs (and while probing: a peer probing too must see
    this rank alive); turn a failed collective into one line naming the lost peers."""
    beat = Heartbeat(host, port, rank, world, timeout_s) if world > 1 else None
    wait_s = STORE_TIMEOUT_S  # every peer is there after a good run: the call ends at once
    try:
        yield
    except Exception as err:
        wait_s = BEAT_S  # the store may be cut off: the error line must not wait on it
        if beat is None or not is_comm_failure(err) or _reported.is_set():
            raise
        _reported.set()
        cause = (f"no answer within --dist-timeout {timeout_s:g} s" if "imed out" in str(err)
                 else str(err).strip().splitlines()[-1][:160])
        lost = lost_ranks(host, port, rank, world)
        dump = flight_recorder.dump(rank)
        where = f"; {dump}" if dump else ""
        if lost is None:
            raise UserError(f"{store_lost(host, port, cause)}; the other ranks stop too{where}") from None
        if not lost:
            raise UserError(f"a collective failed ({cause}) but every peer still answers; "
                            f"see the other ranks' output{where}") from None
        raise UserError(f"lost {describe(lost)}: it stopped answering ({cause}); the other ranks stop too{where}") from None
    finally:
        if beat is not None:
            beat.close(wait_s)
