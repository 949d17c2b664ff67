"""Which run a Slurm job resumes (handler/train/run_identity.py): its own only, never another
job's with the same id (a reset controller starts at job 1 again)."""
import subprocess
import sys

from handler.train.run_identity import IDENTITY, beside, choose, held_by, record
from tests.conftest import ROOT


def saved_run(folder, run: str):
    """A folder as train.sbatch and a save leave it: the run's name and a last.pt."""
    folder.mkdir(parents=True)
    (folder / IDENTITY).write_text(run + "\n")
    (folder / "last.pt").write_bytes(b"old run's weights")
    return folder


def test_a_first_start_names_its_run_and_takes_an_empty_folder(tmp_path):
    choice = choose(str(tmp_path / "slurm-1"), cluster="local-b", job="1", stamp="T1")
    assert (choice.folder, choice.resume, choice.run, choice.note) == (str(tmp_path / "slurm-1"), False,
                                                                      "local-b/1/T1", "")


def test_a_requeued_job_resumes_its_own_run(tmp_path):
    folder = saved_run(tmp_path / "slurm-1", "local-a/1/T0")
    choice = choose(str(folder), cluster="local-a", job="1", run="local-a/1/T0", stamp="T5")
    assert (choice.folder, choice.resume, choice.note) == (str(folder), True, "")


def test_a_new_job_with_a_repeated_id_never_resumes_the_old_run(tmp_path):
    """After cluster.sh down/up: job 1 again, same default folder. It used to resume at epoch 7."""
    folder = saved_run(tmp_path / "slurm-1", "local-a/1/T0")
    choice = choose(str(folder), cluster="local-b", job="1", stamp="T9")
    assert not choice.resume and choice.folder == beside(str(folder), "local-b/1/T9") != str(folder)
    assert choice.note == (f"not resuming {folder}: it holds run local-a/1/T0, and this is run local-b/1/T9; "
                           f"a job resumes only its own run, so this one starts afresh in {choice.folder}")
    record(choice)
    assert held_by(str(folder)) == "local-a/1/T0" and (folder / "last.pt").read_bytes() == b"old run's weights"


def test_the_same_cluster_name_and_id_after_a_state_reset_is_still_another_run(tmp_path):
    """A real cluster keeps its name when its controller's state is reset: only the recorded
    run name (the job's Comment) tells a requeue from a new job."""
    folder = saved_run(tmp_path / "slurm-1", "prod/1/T0")
    assert not choose(str(folder), cluster="prod", job="1", stamp="T9").resume
    unnamed = saved_run(tmp_path / "by-hand", "")
    assert "it holds a run that names no Slurm job" in choose(str(unnamed), cluster="prod", job="1", stamp="T9").note


def test_a_requeue_finds_the_folder_its_fresh_start_moved_to(tmp_path):
    folder = saved_run(tmp_path / "slurm-1", "local-a/1/T0")
    first = choose(str(folder), cluster="local-b", job="1", stamp="T9")
    record(first)
    again = choose(str(folder), cluster="local-b", job="1", run=first.run, stamp="T12")
    assert (again.folder, again.resume) == (first.folder, False)  # requeued before its first save
    (tmp_path / again.folder / "last.pt").write_bytes(b"new run")
    assert choose(str(folder), cluster="local-b", job="1", run=first.run, stamp="T20").resume


def test_an_explicit_resume_or_overwrite_adopts_the_folder(tmp_path):
    folder = saved_run(tmp_path / "slurm-1", "local-a/1/T0")
    choice = choose(str(folder), cluster="local-b", job="1", stamp="T9", adopt=True)
    assert (choice.folder, choice.resume, choice.note) == (str(folder), False, "")


def test_the_command_prints_folder_resume_and_name_and_says_why_in_one_line(tmp_path):
    folder = saved_run(tmp_path / "slurm-1", "local-a/1/T0")
    proc = subprocess.run([sys.executable, "-m", "handler.train.run_identity", folder, "--cluster", "local-b",
                           "--job", "1", "--run", "", "--stamp", "T9"], cwd=ROOT, capture_output=True, text=True)
    new = beside(str(folder), "local-b/1/T9")
    assert proc.returncode == 0 and proc.stdout.splitlines() == [new, "0", "local-b/1/T9"]
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(f"train.sbatch: not resuming {folder}")
    assert held_by(new) == "local-b/1/T9" and held_by(str(folder)) == "local-a/1/T0"
