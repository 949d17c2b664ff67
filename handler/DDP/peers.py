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

A rank that is alive but stuck (a hung read in its data loader) still beats. So each beat also
publishes where the rank is (handler/runtime/phases.py HERE: epoch, step, phase, since when).
Once this rank has waited in one place for --dist-timeout, the ranks furthest back are named
with their phase, by the first rank that is not behind; on gloo a collective that times out
says the same (`watch`). It runs in the heartbeat thread, so it works alike on NCCL, whose
collectives do not return to Python. The first rank to explain a stop takes a counter in the
store; every later one (a peer that then sees it gone) exits without a second line.
"""
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch.distributed as tdist

from ..data.loaders import stall_bound_s, stalled_loader
from ..runtime import dist, stopping
from ..runtime.errors import Stalled, UserError
from ..runtime.names import BACKWARD, CHECKPOINT, DATA, FORWARD, H2D, OPTIMIZER, TEST, VALIDATE
from ..runtime.phases import HERE, STARTUP, Position
from . import flight_recorder
from .store_link import BoundedStore

BEAT_S = 0.5
MIN_SILENCE_S = 3.0  # a few missed beats under load are not a lost peer
STORE_TIMEOUT_S = 5.0
KEY = "harness/beat/{}"
WHERE = "harness/where/{}"  # the rank's Position, as text
SAID = "harness/said/{}"  # per elastic attempt: how many ranks have tried to explain the stop
CAUSES = {STARTUP: "its set-up", DATA: "its data loader", H2D: "its copy to the GPU", FORWARD: "its forward pass",
          BACKWARD: "its backward pass", OPTIMIZER: "its optimizer step", VALIDATE: "its validation",
          TEST: "its test pass", CHECKPOINT: "writing the checkpoint"}
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
        self.host, self.port, self.rank, self.world, self.timeout_s = host, port, rank, world, timeout_s
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
        counts, silent_since, published = {}, None, ""
        heard = {p: time.monotonic() for p in self.peers}
        while not self._stop.wait(BEAT_S):
            now, stuck = time.monotonic(), None
            try:
                self._link = self._link or _client(self.host, self.port)
                if self._link is None:
                    raise OSError("no store")
                self._link.add(KEY.format(self.rank), 1)
                where = HERE.text()
                if where != published:
                    self._link.set(WHERE.format(self.rank), where)
                    published = where
                for p in self.peers:
                    count = self._link.add(KEY.format(p), 0)
                    if counts.get(p) != count:
                        counts[p], heard[p] = count, now
                silent_since = None
                waited = time.time() - HERE.since
                if HERE.phase == DATA and waited > stall_bound_s(self.timeout_s):
                    stuck = stalled_loader(waited)  # this rank's own loader: no peer named it
                elif waited > self.timeout_s:
                    stuck = self._others_stuck()
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
            if stuck:
                self._give_up(stuck)

    def _others_stuck(self) -> Optional[str]:
        """This rank has waited in one place for --dist-timeout: the line naming the ranks
        furthest back, said by the first rank that is not one of them (None otherwise)."""
        assert self._link is not None
        where = positions(self._link, self.world, self.rank)
        slow = behind(where)
        ahead = [r for r in sorted(where) if r not in slow]
        if not slow or ahead[0] != self.rank:
            return None
        return stuck_line(where, slow, self.rank, self.timeout_s)

    def _give_up(self, message: str) -> None:
        """The main thread may be blocked in C++ for good: say it here and end the process."""
        if self._stop.is_set() or _reported.is_set():
            return
        _reported.set()
        if stopping.received() or not first_to_explain(self._link):
            os._exit(2)  # a peer said why first, or its launcher is ending this rank: it only saw the others go
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


def positions(store: BoundedStore, world: int, rank: int) -> Dict[int, Position]:
    """Where every rank that published is; this rank's own from HERE, which is fresher."""
    where = {r: Position.parse(raw.decode()) for r in range(world) if r != rank
             for raw in [store.get(WHERE.format(r))] if raw is not None}
    return {**where, rank: HERE}


def behind(where: Dict[int, Position]) -> List[int]:
    """The ranks furthest back in the loop, when not every rank is there."""
    order = {r: p.order() for r, p in where.items()}
    last = min(order.values())
    return [] if last == max(order.values()) else sorted(r for r, o in order.items() if o == last)


def stuck_line(where: Dict[int, Position], slow: List[int], waiter: int, timeout_s: float) -> str:
    now = time.time()
    each = "; ".join(f"{describe([r])} is stuck in {where[r]} for {now - where[r].since:.0f} s "
                     f"({CAUSES.get(where[r].phase, 'its loop')})" for r in slow)
    return f"{each}; rank {waiter} waits in {where[waiter]} (--dist-timeout {timeout_s:g} s)"


def first_to_explain(store: Optional[BoundedStore]) -> bool:
    """True for the first rank of this attempt to explain the stop, and whenever the store
    cannot tell (better two lines than none)."""
    if store is None:
        return True
    try:
        return store.add(SAID.format(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), 1) == 1
    except Exception:  # noqa: BLE001 - the store is gone: say it
        return True


def _explained_first(host: str, port: int) -> bool:
    store = _client(host, port)
    try:
        return first_to_explain(store)
    finally:
        if store is not None:
            store.close()


def _stuck_peers(host: str, port: int, rank: int, world: int, timeout_s: float) -> Optional[str]:
    store = _client(host, port)
    if store is None:
        return None
    try:
        where = positions(store, world, rank)
    except Exception:  # noqa: BLE001 - no positions: the plainer line
        return None
    finally:
        store.close()
    slow = behind(where)
    return stuck_line(where, slow, rank, timeout_s) if slow else None


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
        if beat is None or _reported.is_set() or not (is_comm_failure(err) or isinstance(err, Stalled)):
            raise
        _reported.set()
        line = str(err) if isinstance(err, Stalled) else _verdict(err, host, port, rank, world, timeout_s)
        if stopping.received() or not _explained_first(host, port):
            raise SystemExit(2) from None  # a peer said why first, or the launcher is ending this rank
        raise UserError(line) from None
    finally:
        if beat is not None:
            beat.close(wait_s)


def _verdict(err: Exception, host: str, port: int, rank: int, world: int, timeout_s: float) -> str:
    """A failed collective, as the line naming who is lost or behind."""
    cause = (f"no answer within --dist-timeout {timeout_s:g} s" if "imed out" in str(err)
             else str(err).strip().splitlines()[-1][:160])
    lost = lost_ranks(host, port, rank, world)
    stuck = _stuck_peers(host, port, rank, world, timeout_s) if lost == [] else None
    dump = flight_recorder.dump(rank)
    where = f"; {dump}" if dump else ""
    if lost is None:
        return f"{store_lost(host, port, cause)}; the other ranks stop too{where}"
    if stuck:
        return f"{stuck}; the other ranks stop too{where}"
    if not lost:
        return f"a collective failed ({cause}) but every peer still answers; see the other ranks' output{where}"
    return f"lost {describe(lost)}: it stopped answering ({cause}); the other ranks stop too{where}"
