"""Naming the peer a run lost: a collective that fails or times out says only that it did.

Every rank beats a counter in the rendezvous store once a second, on a connection of its
own. When a collective fails, the rank reads the counters twice, BEAT_S * 3 apart: the
ranks whose counters stood still are the lost ones, and dist.HOSTS names their hosts.
When the store itself does not answer, rank 0 (which serves it) or its host is lost.
"""
import datetime
import socket
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


def _client(host: str, port: int):
    """A store connection of our own, or None when the store does not answer. Probed with a
    plain socket first: a TCPStore that cannot connect logs a C++ backtrace."""
    try:
        socket.create_connection((host, port), timeout=STORE_TIMEOUT_S).close()
    except OSError:
        return None
    return tdist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))


class Heartbeat:
    def __init__(self, host: str, port: int, rank: int):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(host, port, KEY.format(rank)),
                                        name="harness-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self, host, port, key):
        store = None
        while not self._stop.wait(BEAT_S):
            try:
                store = store or _client(host, port)
                if store is not None:
                    store.add(key, 1)
            except Exception:  # noqa: BLE001 - unreachable for now: try again, a cut link may heal
                store = None

    def close(self) -> None:
        self._stop.set()


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


def describe(ranks) -> str:
    return ", ".join(f"rank {r} ({dist.HOSTS.get(r, '?')})" for r in ranks)


def is_comm_failure(err: BaseException) -> bool:
    return isinstance(err, tdist.DistError) or (
        isinstance(err, RuntimeError) and any(s in str(err) for s in COMM_FAILURE))


@contextmanager
def watch(host: str, port: int, rank: int, world: int, timeout_s: float):
    """Beat while the block runs (and while probing: a peer probing too must see this rank
    alive); turn a failed collective into one line naming the lost peers."""
    beat = Heartbeat(host, port, rank) if world > 1 else None
    try:
        yield
    except Exception as err:
        if beat is None or not is_comm_failure(err):
            raise
        cause = (f"no answer within --dist-timeout {timeout_s:g} s" if "imed out" in str(err)
                 else str(err).strip().splitlines()[-1][:160])
        lost = lost_ranks(host, port, rank, world)
        if lost is None:
            gone = [r for r, h in sorted(dist.HOSTS.items()) if h == dist.HOSTS.get(0)] or [0]
            raise UserError(f"lost {describe(gone)}: the rendezvous store on {host}:{port} does not answer "
                            f"({cause}); the other ranks stop too") from None
        if not lost:
            raise UserError(f"a collective failed ({cause}) but every peer still answers; "
                            "see the other ranks' output") from None
        raise UserError(f"lost {describe(lost)}: it stopped answering ({cause}); the other ranks stop too") from None
    finally:
        if beat is not None:
            beat.close()
