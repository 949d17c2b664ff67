"""A job profiled per node on the local Slurm cluster (scripts/cluster.sh): PROFILE=1 train.sbatch
leaves one nsys report per node, and one summary of the job comes from both.

Marker `cluster` (scripts/test_cluster.sh runs it; the main suite does not). Two profiled 1-epoch
ddp jobs (4 steps) of one rank per node: one on the plain links, one with node2's link shaped slow, whose
all-reduces wait on the wire, so more of the communication is exposed.
"""
import json
import subprocess
import sys

import pytest

from tests.cluster_support import ROOT, up_cluster
from tests.conftest import tail
from tests.nsys_helpers import require_nsys

pytestmark = pytest.mark.cluster
SLOW = "40mbit"  # node2's link when shaped: 4mbit exposed 38 s over 4 steps, 0.5 s plain; this ~10x less


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    require_nsys()
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(line):
        with capture.global_and_fixture_disabled():
            print(f"\ncluster set-up: {line}", flush=True)
    made = up_cluster(tmp_path_factory, say)
    try:
        yield made
    finally:
        made.script("down", timeout=120)


def profiled_job(cluster, folder) -> tuple[list, int, dict]:
    """(the reports' names, the job id, the job summary's JSON) of a profiled 1-epoch ddp job."""
    logs = folder / "nsight"
    job = cluster.submit(folder, ["--mode", "ddp", "--epochs", 1, "--batch-size", 64],  # 4 steps per rank
                         env={"NPROC_PER_NODE": "1", "PROFILE": "1", "NSIGHT_LOG_DIR": str(logs)})
    job.finish(limit=180)
    assert job.succeeded, f"the job ended {job.state} {job.exit_code}; output:\n{tail(job.output(), 40)}"
    reports = sorted(p.name for p in logs.glob("*.nsys-rep"))
    run = subprocess.run([sys.executable, "-m", "handler.profiling.report", str(logs), "--out", str(folder / "out")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return reports, job.id, json.loads((folder / "out" / f"{job.id}.summary.json").read_text())


def test_a_job_profiled_per_node_gives_one_summary_and_a_slow_link_shows_as_exposed_comm(cluster, tmp_path):
    reports, job, plain = profiled_job(cluster, tmp_path / "plain")
    assert reports == [f"{job}_node1.nsys-rep", f"{job}_node2.nsys-rep"]
    assert [(r["rank"], r["host"]) for r in plain["ranks"]] == [(0, "node1"), (1, "node2")]
    assert [r["hosts"] for r in plain["reports"]] == [["node1"], ["node2"]]  # each report only its node's ranks
    assert sorted(plain["hosts"]) == ["node1", "node2"] and plain["stragglers"]["most_often_last_host"]
    cluster.script("shape", "node2", "--rate", SLOW)
    try:
        _, _, shaped = profiled_job(cluster, tmp_path / "shaped")
    finally:
        cluster.script("shape", "--clear")
    exposed = [sum(h["comm_exposed_s"] for h in s["hosts"].values()) for s in (plain, shaped)]
    print(f"\nexposed communication, both hosts: {exposed[0]:.3f} s plain, {exposed[1]:.3f} s with node2 at {SLOW}")
    assert exposed[1] > exposed[0] * 1.5, exposed
