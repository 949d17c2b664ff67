"""A new job never resumes another job's run, even with the same id (docs/CHECKPOINTS.md).

After `scripts/cluster.sh down` and `up`, Slurm's job ids start at 1 again; train.sbatch's
folder for job 1 then held the old job 1's run, and the new job resumed it. A cluster of its
own (down/up would end the one tests/tools/test_cluster.py shares); `up` takes about a second.
The requeue side (a requeued job resumes its own run) is test_cluster.py's preemption test.
"""
import pytest

from tests.tools.test_cluster import cluster_for_module, job_failed

pytestmark = pytest.mark.cluster
# One step an epoch (96 training images): the first job only has to leave a run behind.
ONE_STEP = ["--mode", "ddp", "--epochs", 1, "--synthetic-train", 160]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from cluster_for_module(tmp_path_factory, request)


def test_a_new_job_with_an_old_jobs_id_starts_afresh_beside_its_run_and_says_why(cluster, tmp_path):
    old = cluster.submit(tmp_path, ONE_STEP, env={"NPROC_PER_NODE": "1"})
    old.finish()
    assert old.succeeded, job_failed(old, f"the first job ended {old.state} {old.exit_code}")
    ckpt = tmp_path / "ckpt"
    before = (ckpt / "last.pt").read_bytes()

    cluster.script("down", timeout=120)
    cluster.script("up", "--nodes", "2", timeout=120)
    (tmp_path / "out.txt").rename(tmp_path / "old-out.txt")
    new = cluster.submit(tmp_path, ONE_STEP, env={"NPROC_PER_NODE": "1"})
    assert new.id == old.id  # the premise: the id repeats
    new.wait_for(r"^ddp: ")  # training started, after where a resume would have said so
    cluster.script("run", "scancel", new.id)
    new.finish()
    assert "resumed from" not in new.output() and "(resuming)" not in new.output(), \
        job_failed(new, "the new job resumed the old job's run")
    said = [line for line in new.output().splitlines() if line.startswith("train.sbatch: not resuming")]
    assert len(said) == 1, job_failed(new, "no line saying why it did not resume")
    run = (ckpt / "slurm-run").read_text().strip()
    assert f"not resuming {ckpt}: it holds run {run}" in said[0]
    assert (ckpt / "last.pt").read_bytes() == before and (ckpt / "slurm-run").read_text().strip() == run
    fresh = said[0].rsplit(" starts afresh in ", 1)[1]
    assert fresh != str(ckpt) and f"checkpoints in {fresh}\n" in new.output()  # what the ranks were given
    assert run.split("/")[0] != (tmp_path / fresh / "slurm-run").read_text().split("/")[0]  # another cluster name
