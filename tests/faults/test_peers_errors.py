"""handler/DDP/peers.py's one-line verdicts, reached without a training run: a store that does
not answer, a peer whose beat stopped, a collective that failed while every peer still beats.
In-process against a real TCPStore; the heartbeat's own give-up ends its process (os._exit),
so that one runs in a small subprocess."""
import datetime
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as tdist

from handler.DDP import peers
from handler.runtime import dist
from handler.runtime.errors import UserError
from tests.conftest import ROOT, free_port


def closed_port() -> int:
    """A port nothing listens on (free now, and outside the range other processes draw from)."""
    return free_port()


def real_store() -> tdist.TCPStore:
    return tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))


@pytest.fixture
def fresh_report(monkeypatch):
    """peers reports once per process: each test starts with nothing reported."""
    monkeypatch.setattr(peers, "_reported", threading.Event())
    monkeypatch.setattr(dist, "HOSTS", {0: "node1", 1: "node2", 2: "node1"})


def test_a_store_that_refuses_the_connection_is_no_client_and_names_rank_0s_host(fresh_report):
    port = closed_port()
    assert peers._client("127.0.0.1", port) is None
    assert peers.lost_ranks("127.0.0.1", port, 1, 3) is None
    # Rank 0 serves the store: every rank on its host is named with it.
    assert peers.store_lost("h", 7, "why") == "lost rank 0 (node1), rank 2 (node1): the rendezvous store on h:7 does not answer (why)"


def test_a_store_that_stops_answering_mid_probe_means_it_is_gone(fresh_report, monkeypatch):
    from tests.faults.test_peers import held_store
    monkeypatch.setattr(peers, "STORE_TIMEOUT_S", 0.5)
    store, port, control = held_store()
    control.sendall(b"f")  # from now on the store's answers are held: even the probe's connection fails
    time.sleep(0.2)
    assert peers.lost_ranks("127.0.0.1", port, 0, 2) is None
    # Held while the probe waits between its two reads: its second read times out.
    store, port, control = held_store()
    threading.Timer(peers.BEAT_S, control.sendall, args=(b"f",)).start()
    assert peers.lost_ranks("127.0.0.1", port, 0, 2) is None


def test_a_failed_collective_names_the_peer_whose_beat_stopped(fresh_report):
    store = real_store()
    with pytest.raises(UserError, match=r"^lost rank 1 \(node2\): it stopped answering \(Connection reset by peer\); "
                                        "the other ranks stop too$"):
        with peers.watch("127.0.0.1", store.port, 0, 2, 60):
            raise RuntimeError("Connection reset by peer")


def test_a_failed_collective_while_every_peer_beats_points_at_their_output(fresh_report):
    store = real_store()
    peer = peers.Heartbeat("127.0.0.1", store.port, 1, 2, 60)
    try:
        with pytest.raises(UserError, match=r"a collective failed \(no answer within --dist-timeout 60 s\) "
                                            "but every peer still answers; see the other ranks' output"):
            with peers.watch("127.0.0.1", store.port, 0, 2, 60):
                raise RuntimeError("Gloo all_reduce: Timed out waiting 60000ms")
    finally:
        peer.close(peers.STORE_TIMEOUT_S)


def test_a_failed_collective_with_no_store_names_rank_0_and_other_errors_pass_through(fresh_report):
    port = closed_port()
    with pytest.raises(UserError, match=f"lost rank 0 \\(node1\\), rank 2 \\(node1\\): the rendezvous store on "
                                        f"127.0.0.1:{port} does not answer \\(Broken pipe\\)"):
        with peers.watch("127.0.0.1", port, 1, 3, 60):
            raise RuntimeError("Broken pipe")
    with pytest.raises(ValueError, match="not a collective"):
        with peers.watch("127.0.0.1", port, 1, 3, 60):
            raise ValueError("not a collective")


# Rank 0's heartbeat with --dist-timeout 1 (silent after 3 s): against a store serving no peer
# ("peer"), or against no store at all ("store"). The beat must end the process by itself.
GIVE_UP = """
import sys, time
import torch.distributed as tdist, datetime
from handler.DDP import peers
case, port = sys.argv[1], int(sys.argv[2])
if case == "peer":
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    port = store.port
peers.Heartbeat("127.0.0.1", port, 0, 2, 1)
time.sleep(30)
print("the heartbeat never gave up")
"""


@pytest.mark.slow  # 12 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_heartbeat_gives_up_in_one_line_on_a_silent_peer_or_a_store_that_does_not_answer():
    port = closed_port()
    procs = {case: subprocess.Popen([sys.executable, "-c", GIVE_UP, case, str(port)], cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for case in ("peer", "store")}
    out = {case: proc.communicate(timeout=60) for case, proc in procs.items()}
    limit = "no heartbeat for 3 s (--dist-timeout 1 s)"
    me = socket.gethostname()
    assert procs["peer"].returncode == 2, out["peer"]
    assert out["peer"][1].strip().splitlines()[-1] == f"rank 0 ({me}): lost rank 1 (?): {limit}; the other ranks stop too"
    assert procs["store"].returncode == 2, out["store"]
    assert out["store"][1].strip().splitlines()[-1] == (f"rank 0 ({me}): lost rank 0 (?): the rendezvous store on 127.0.0.1:{port} "
                                       f"does not answer ({limit}); the other ranks stop too")
