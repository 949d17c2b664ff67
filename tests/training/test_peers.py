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


def test_a_store_call_failing_while_the_rank_exits_never_aborts_it():
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    front, control = listener(), listener()
    threading.Thread(target=proxy, args=(front, control, store.port), daemon=True).start()
    rank = subprocess.run([sys.executable, "-c", RANK, str(front.getsockname()[1]), str(control.getsockname()[1])],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rank.returncode == 0, f"exit {rank.returncode}:\n{rank.stderr[-2000:]}"
    assert "terminate called" not in rank.stderr
