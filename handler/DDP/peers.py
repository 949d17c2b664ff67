"""A lost peer ends the run within --dist-timeout, and is named.

Every rank beats a counter in the rendezvous store once a second, on a connection of its
own, and watches its ring neighbours' counters. A neighbour silent for --dist-timeout is
lost: this rank names it and exits, whatever collective it is blocked in (some block with
no timeout of their own). A collective that fails first (a closed connection, a timeout) is
turned into the same one line: the counters that stood still name the lost ranks, and
dist.HOSTS their hosts. When the store itself does not answer, rank 0 (which serves it) or
its host is lost.
"""
import datetime
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager

import torch.distributed as tdist

from ..runtime import dist
from ..runtime.errors import UserError

BEAT_S = 1.0
STORE_TIMEOUT_S = 5.0
KEY = "harness/beat/{}"
# What torch's gloo and NCCL errors say when a peer is gone or silent.
COMM_FAILURE = ("Timed out", "timed out", "Connection", "connection", "closed by peer", "Broken pipe",
                "NCCL", "Gloo", "gloo")
_reported = threading.Event()  # one line per process, from the watcher or from the failed collective


def _client(host: str, port: int):
    """A store connection of our own, or None when the store does not answer. Probed with a
    plain socket first: a TCPStore that cannot connect logs a C++ backtrace."""
    try:
        socket.create_connection((host, port), timeout=STORE_TIMEOUT_S).close()
    except OSError:
        return None
    return tdist.TCPStore(host, port, is_master=False, wait_for_workers=False,  # pyright: ignore[reportPrivateImportUsage]  # public API; torch.distributed re-exports it without __all__
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))


def describe(ranks) -> str:
    return ", ".join(f"rank {r} ({dist.HOSTS.get(r, '?')})" for r in ranks)


def store_lost(host: str, port: int, why: str) -> str:
    gone = [r for r, h in sorted(dist.HOSTS.items()) if h == dist.HOSTS.get(0)] or [0]
    return f"lost {describe(gone)}: the rendezvous store on {host}:{port} does not answer ({why})"


class Heartbeat:
    """Beats this rank's counter and watches its neighbours' (a thread; close() stops it).

    close() waits for the thread: a thread still inside a store call when the process exits
    aborts it (SIGABRT, "terminate called without an active exception") if the store drops
    the call then, as it does when rank 0 ends first.
    """

    def __init__(self, host: str, port: int, rank: int, world: int, timeout_s: float):
        self.host, self.port, self.rank, self.timeout_s = host, port, rank, timeout_s
        self.peers = sorted({(rank - 1) % world, (rank + 1) % world} - {rank})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-heartbeat", daemon=True)
        self._thread.start()

    def _run(self):
        store, counts, silent_since = None, {}, None
        heard = {p: time.monotonic() for p in self.peers}
        while not self._stop.wait(BEAT_S):
            now = time.monotonic()
            try:
                store = store or _client(self.host, self.port)
                if store is None:
                    raise OSError("no store")
                store.add(KEY.format(self.rank), 1)
                for p in self.peers:
                    count = store.add(KEY.format(p), 0)
                    if counts.get(p) != count:
                        counts[p], heard[p] = count, now
                silent_since = None
            except Exception:  # noqa: BLE001 - unreachable for now: a cut link may heal
                store, silent_since = None, silent_since or now
            limit = f"no heartbeat for --dist-timeout {self.timeout_s:g} s"
            if silent_since is not None and now - silent_since > self.timeout_s:
                self._give_up(store_lost(self.host, self.port, limit))
            lost = [p for p in self.peers if now - heard[p] > self.timeout_s]
            if silent_since is None and lost:
                self._give_up(f"lost {describe(lost)}: {limit}")

    def _give_up(self, message: str) -> None:
        """The main thread may be blocked in C++ for good: say it here and end the process."""
        if self._stop.is_set() or _reported.is_set():
            return
        _reported.set()
        print(f"rank {self.rank} ({socket.gethostname()}): {message}; the other ranks stop too",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)

    def close(self, wait_s: float) -> None:
        """Stop beating; return once the thread has left its store call, or after wait_s
        (a call to a store that is cut off, not closed, never returns)."""
        self._stop.set()
        self._thread.join(timeout=wait_s)


def lost_ranks(host: str, port: int, rank: int, world: int):
    """Ranks whose beat stopped (never this one); None when the store does not answer."""
    try:
        store = _client(host, port)
        if store is None:
            return None
        before = [store.add(KEY.format(r), 0) for r in range(world)]
        time.sleep(3 * BEAT_S)
        after = [store.add(KEY.format(r), 0) for r in range(world)]
    except Exception:  # noqa: BLE001 - unreachable, refused or timed out: all mean "gone"
        return None
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
        if lost is None:
            raise UserError(f"{store_lost(host, port, cause)}; the other ranks stop too") from None
        if not lost:
            raise UserError(f"a collective failed ({cause}) but every peer still answers; "
                            "see the other ranks' output") from None
        raise UserError(f"lost {describe(lost)}: it stopped answering ({cause}); the other ranks stop too") from None
    finally:
        if beat is not None:
            beat.close(wait_s)
