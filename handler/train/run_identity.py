"""Which Slurm job a checkpoint folder's run belongs to, so a new job never resumes another's.

Job ids repeat: a controller whose state was reset (scripts/cluster.sh down/up) starts at 1
again, and two clusters may share a filesystem. A run is therefore named by its cluster, job
id and the time of the job's first start (`cluster/job/stamp`). Slurm keeps neither that time
nor anything else that tells a requeued job from a new one with the same id (SubmitTime is
reset by a requeue), so scripts/slurm/train.sbatch stores the run's name in the job's Comment
at its first start, which a requeue keeps, and in the folder's IDENTITY file. A job resumes a
folder only when both hold the same name; a folder holding another job's run is left alone
and the job starts afresh in a new folder beside it (docs/CHECKPOINTS.md).

    python -m handler.train.run_identity FOLDER --cluster C --job J [--run NAME] [--stamp S] [--adopt]

prints the folder to use, 1 or 0 (resume or not) and the run's name, one a line, after
recording the name in the folder; why it did not resume goes to stderr, in one line.
"""
import argparse
import dataclasses
import datetime
import os
import sys

IDENTITY = "slurm-run"  # the file in the checkpoint folder that names its run


@dataclasses.dataclass(frozen=True)
class Choice:
    folder: str
    resume: bool
    run: str
    note: str = ""  # why a folder holding a checkpoint was not resumed; empty otherwise


def held_by(folder: str) -> str:
    """The run a folder's checkpoints belong to ("" when no job of this harness recorded one)."""
    try:
        with open(os.path.join(folder, IDENTITY)) as f:
            return f.read().strip()
    except OSError:
        return ""


def beside(folder: str, run: str) -> str:
    """The new folder for `run` next to one that holds another run: a name no other run has."""
    return f"{folder.rstrip('/')}.{run.replace('/', '-')}"


def choose(folder: str, *, cluster: str, job: str, run: str = "", stamp: str = "", adopt: bool = False) -> Choice:
    """Where job `job` of `cluster` trains and whether it resumes. `run` is the name the job's
    first start recorded (empty at a first start, which then names it from `stamp`); with
    `adopt` (the user passed --resume or --overwrite) the folder is used as it is."""
    mine = run or f"{cluster}/{job}/{stamp}"
    has_run = os.path.isfile(os.path.join(folder, "last.pt"))
    if adopt or not has_run:
        return Choice(folder, False, mine)
    for candidate in (folder, beside(folder, mine)):
        if run and held_by(candidate) == run:
            return Choice(candidate, os.path.isfile(os.path.join(candidate, "last.pt")), mine)
    held = held_by(folder)
    whose = f"run {held}" if held else "a run that names no Slurm job"
    new = beside(folder, mine)
    return Choice(new, False, mine, f"not resuming {folder}: it holds {whose}, and this is run {mine}; "
                                    f"a job resumes only its own run, so this one starts afresh in {new}")


def record(choice: Choice) -> None:
    """Name the run in its folder (atomically), before anything is saved there."""
    os.makedirs(choice.folder, exist_ok=True)
    path = os.path.join(choice.folder, IDENTITY)
    with open(f"{path}.tmp", "w") as f:
        f.write(choice.run + "\n")
    os.replace(f"{path}.tmp", path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m handler.train.run_identity", allow_abbrev=False, description="Where a Slurm job trains and whether it resumes (docs/MULTINODE.md).")
    p.add_argument("folder")
    p.add_argument("--cluster", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--run", default="", help="the name the job's first start recorded (its Comment)")
    p.add_argument("--stamp", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S"))
    p.add_argument("--adopt", action="store_true", help="use the folder as it is (--resume or --overwrite given)")
    a = p.parse_args(argv)
    choice = choose(a.folder, cluster=a.cluster, job=a.job, run=a.run, stamp=a.stamp, adopt=a.adopt)
    try:
        record(choice)
    except OSError as err:
        print(f"train.sbatch: cannot write {os.path.join(choice.folder, IDENTITY)} ({err.strerror}); "
              "set CKPT to a writable shared folder", file=sys.stderr)
        return 2
    if choice.note:
        print(f"train.sbatch: {choice.note}", file=sys.stderr)
    print(f"{choice.folder}\n{int(choice.resume)}\n{choice.run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
