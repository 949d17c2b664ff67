"""The heartbeat of handler/DDP/peers.py never takes its process down at exit.

A rank's heartbeat thread spends microseconds a second inside a store call. When rank 0
(which serves the store) ended first, that call failed while the other rank exited, and the
thread coming back from C++ into a finalizing interpreter aborted it: "terminate called
without an active exception", rank 1 killed by SIGABRT (seen once in CI on torch 2.6's pp
smoke). Here a proxy between the heartbeat and a real store holds one call open and drops it
while the process exits, so the race is hit every time.
"""
import datetime
import select
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as tdist

from tests.conftest import ROOT

# The rank: beat through the proxy, have one call held (f), ask for the drop in 0.5 s (d),
# close the heartbeat, then keep the GIL into interpreter finalization as a busy exit does.
RANK = """
import atexit, socket, sys, time
from handler.DDP import peers
store_port, control_port = int(sys.argv[1]), int(sys.argv[2])
control = socket.create_connection(("127.0.0.1", control_port))
beat = peers.Heartbeat("127.0.0.1", store_port, 0, 2, 60)
time.sleep(1.5)
control.sendall(b"f")
time.sleep(1.2)
control.sendall(b"d")
beat.close(peers.STORE_TIMEOUT_S)
def hold_the_gil():
    sys.setswitchinterval(100)
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        pass
atexit.register(hold_the_gil)
"""


def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def proxy(front, control, store_port):
    """Pass bytes between clients and the store; after b"f" hold the store's replies, after
    b"d" wait 0.5 s and close every connection."""
    control = control.accept()[0]
    ends, hold = {}, False
    while True:
        ready, _, _ = select.select([front, control, *ends], [], [], 30)
        if not ready:
            return
        if front in ready:
            a, b = front.accept()[0], socket.create_connection(("127.0.0.1", store_port))
            ends[a], ends[b] = b, a
        if control in ready:
            if control.recv(1) == b"d":
                time.sleep(0.5)
                for s in ends:
                    s.close()
                return
            hold = True
        for s in set(ready) & set(ends):
            data = s.recv(65536)
            from_store = s.getpeername()[1] == store_port
            if data and not (hold and from_store):
                ends[s].sendall(data)


@pytest.mark.slow  # 12 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_store_call_failing_while_the_rank_exits_never_aborts_it():
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    front, control = listener(), listener()
    threading.Thread(target=proxy, args=(front, control, store.port), daemon=True).start()
    rank = subprocess.run([sys.executable, "-c", RANK, str(front.getsockname()[1]), str(control.getsockname()[1])],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rank.returncode == 0, f"exit {rank.returncode}:\n{rank.stderr[-2000:]}"
    assert "terminate called" not in rank.stderr


def held_store():
    """A real store behind the proxy; returns (proxy port, control socket): b"f" on the
    control socket makes the proxy hold every answer from then on, as a store cut off
    (no FIN, no RST) never answers."""
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    front, control = listener(), listener()
    threading.Thread(target=proxy, args=(front, control, store.port), daemon=True).start()
    return store, front.getsockname()[1], socket.create_connection(("127.0.0.1", control.getsockname()[1]))


def test_a_store_call_to_a_store_that_is_cut_off_fails_within_its_bound():
    from handler.DDP.store_link import BoundedStore
    store, port, control = held_store()
    link = BoundedStore("127.0.0.1", port, 1.0)
    assert link.add("k", 1) == 1
    control.sendall(b"f")
    time.sleep(0.2)
    start = time.monotonic()
    try:
        link.add("k", 1)
        raise AssertionError("a held call returned")
    except tdist.DistError:
        pass  # closed by the relay
    assert time.monotonic() - start < 1.0 + 1.0
    link.close()
    assert not link._thread.is_alive()


def test_a_heartbeat_whose_store_is_cut_off_never_outlives_its_run():
    from handler.DDP import peers
    store, port, control = held_store()
    beat = peers.Heartbeat("127.0.0.1", port, 0, 2, 60)  # silent after 20 s: it never gives up here
    time.sleep(3 * peers.BEAT_S)
    control.sendall(b"f")
    time.sleep(3 * peers.BEAT_S)  # a beat is held now, and would be for ever
    start = time.monotonic()
    beat.close(peers.BEAT_S)
    assert not beat._thread.is_alive(), "the heartbeat thread outlived its run"
    assert time.monotonic() - start < peers.BEAT_S + 1.0
