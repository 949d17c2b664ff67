"""The local cluster's shaped links (scripts/cluster.sh shape): the delay they add, the rate
they carry, and a delay line (kernels without netem) that fails open and says so when its
program is gone. Marker `cluster`; one network-only cluster of its own (no Slurm), measured
with scripts/cluster/probe.py from inside the hosts (docs/MULTINODE.md has the full table).
"""
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.cluster_support import SCRIPT, Cluster, require_cluster_machine
from tests.conftest import ROOT

pytestmark = pytest.mark.cluster
PROBE = ROOT / "scripts" / "cluster" / "probe.py"
DELAY_MS = 5


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    require_cluster_machine()
    cluster = Cluster(tmp_path_factory.mktemp("net_state"), tmp_path_factory.mktemp("net_data"))
    server = None
    try:
        cluster.script("up", "--net-only", "--nodes", "2", timeout=300)  # the first use installs iptables
        server = subprocess.Popen(["bash", str(SCRIPT), "exec", "node2", sys.executable, str(PROBE), "serve"],
                                  env={**os.environ, **cluster.env}, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        answered(cluster, server)
        yield cluster
    finally:
        if server is not None:  # only the process group started here
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        cluster.script("down", timeout=120)


def answered(cluster: Cluster, server: subprocess.Popen, within_s: float = 60) -> None:
    """Returns once node2's echo server answers: on a busy box its Python takes seconds to
    start, and a datagram sent before that is lost (the tests count every loss)."""
    deadline = time.monotonic() + within_s
    while probe(cluster, "rtt", "--count", "1")["lost"]:
        assert server.poll() is None, f"the probe's server on node2 ended (exit {server.returncode})"
        assert time.monotonic() < deadline, f"the probe's server on node2 did not answer in {within_s:.0f} s"


def probe(cluster: Cluster, what: str, *options) -> dict[str, Any]:
    proc = cluster.script("exec", "node1", sys.executable, PROBE, what, "node2", *options)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rtt(cluster: Cluster, which: str = "rtt_ms_median") -> float:
    found = probe(cluster, "rtt", "--count", "10")
    assert found["lost"] == 0, found
    print(f"rtt: {found}")  # shown beside a failure: the spread, not only the median
    return found[which]


def shaped_rtt(cluster: Cluster, delay_ms: float) -> float:
    """The fastest of ten round trips with node1 delayed DELAY_MS each way: the fastest is
    the one least held up by the box's load (the Python echo on both ends runs unprivileged)."""
    cluster.script("shape", "node1", "--rate", "1000mbit", "--delay", f"{delay_ms}ms")
    return rtt(cluster, "rtt_ms_min")


def test_a_shaped_link_delays_the_round_trip_by_twice_its_delay(net):
    """Each ms of delay adds 2 ms to the round trip (one delayed port, crossed both ways),
    and no frame leaves early. The slope between two delays is the delay's own effect: the
    fixed cost of the path (two Python echo ends, the delay line's wake-ups: 0.5 ms on a quiet
    box, 1.6 ms on a slow busy one) is in both and cancels, so the test holds beside a load."""
    short, long = shaped_rtt(net, 1), shaped_rtt(net, DELAY_MS)
    assert long >= 2 * DELAY_MS, "the delay line released a frame before its delay"
    assert long - short == pytest.approx(2 * (DELAY_MS - 1), abs=0.1 * 2 * (DELAY_MS - 1) + 0.5)
    assert long < 2 * DELAY_MS + 5, "the path's fixed cost beside the delay is more than 5 ms"


def test_a_shaped_link_with_delay_carries_its_rate(net):
    net.script("shape", "node1", "--rate", "100mbit", "--delay", f"{DELAY_MS}ms")
    assert probe(net, "bulk", "--seconds", "2")["mbit_s"] == pytest.approx(100, rel=0.15)


def test_a_stopped_delay_line_passes_frames_undelayed_says_so_and_shape_restarts_it(net):
    record = net.state / "run" / "delay.pid"
    if not record.exists():
        pytest.skip("this kernel has netem: shape delays with it, no delay line runs")
    net.script("shape", "node1", "--rate", "1000mbit", "--delay", f"{DELAY_MS}ms")
    os.kill(int(record.read_text().split()[0]), signal.SIGKILL)  # the program this cluster started
    time.sleep(0.2)
    assert rtt(net) < 2, "a dead delay line must fail open, not black-hole the link"
    assert "THE DELAY LINE IS NOT RUNNING" in net.script("status").stderr
    shaped = net.script("shape", "node1", "--rate", "1000mbit", "--delay", f"{DELAY_MS}ms")
    assert "restarting the delay line" in shaped.stdout
    assert 2 * DELAY_MS <= rtt(net, "rtt_ms_min") < 2 * DELAY_MS + 5, "the restarted line delays again"
