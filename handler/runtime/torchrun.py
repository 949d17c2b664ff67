"""torchrun whose failure report is one line instead of a traceback (docs/FAILURES.md).

    python -m handler.runtime.torchrun [torchrun's arguments]

When a worker fails, torchrun raises ChildFailedError out of its main and Python prints
the traceback and a 30-line table, after the worker already said why in its own one line
(handler/runtime/errors.py). Here that becomes one line naming the first worker that failed
and how; the exit status is the worker's (128 + N for signal N). A torchrun that is itself told to
stop (Slurm ends a job step with SIGTERM once another node's rank failed) says so in one line
and exits 128 + N, instead of torch's SignalException traceback. scripts/slurm/train.sbatch
launches through it.
"""
import signal
import socket
import sys
from typing import Optional


def failure_line(rank: int, local_rank: int, exitcode: int, host: str) -> tuple[str, int]:
    """The one line and the exit status for the first worker that failed."""
    if exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        how, status = f"was killed by {name}", 128 - exitcode
    else:
        how, status = f"exited with code {exitcode}", exitcode
    return (f"torchrun: rank {rank} (local rank {local_rank} on {host}) {how} first; its own output above says "
            "why, and the other workers were stopped"), status


def main(argv: Optional[list[str]] = None) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run.main(argv)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        # torchrun's workers run beside it: their host is this one.
        line, status = failure_line(rank, failure.local_rank, failure.exitcode, socket.gethostname())
        print(line, file=sys.stderr, flush=True)
        return status
    except SignalException as err:
        print(f"torchrun ({socket.gethostname()}): stopped by {err.sigval.name}; its workers were stopped "
              "with it (a failure elsewhere is named in the output above)", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    from handler.runtime.umask import say_started
    say_started()  # scripts/slurm/nsys_node.sh: nsys started the program on this node
    sys.exit(main())
