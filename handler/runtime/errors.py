"""User-facing failures: one line that names the problem and the fix, never a traceback."""
import argparse
import os
import signal
import sys
from contextlib import contextmanager


class UserError(Exception):
    """A problem the user can fix. The message says what is wrong and what to do."""


class Stalled(UserError):
    """This rank waited past a bound of its own (its data loader's): the stop's one line,
    unless a peer explained the stop first (handler/DDP/peers.py)."""


class StopRequested(Exception):
    """Raised after the stop checkpoint is written; the process exits with 128 + signum.
    Here, not in stopping.py, so that tools without torch (the report) start without it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def need(ok, message: str) -> None:
    """An option rule: when ok is false, stop with message (the problem and its fix)."""
    if not ok:
        raise UserError(message)


@contextmanager
def one_line_errors(prefix: str = "error"):
    """Turn UserError (and Ctrl-C) into one line on stderr and a non-zero exit; a graceful
    stop exits with 128 + signal, as a killed process would; a closed stdout pipe, quietly."""
    try:
        yield
    except StopRequested as stop:  # the stop message and checkpoint are already out
        sys.exit(stop.exit_code)
    except UserError as err:  # several problems (import_problems): each its own line
        print("\n".join(f"{prefix}: {line}" for line in str(err).splitlines() or [""]), file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a shell tool does on SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(128 + signal.SIGPIPE)


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose bad option (an unknown flag, a missing value) is one line naming it and --help,
    exit 2, instead of the usage block: the rule every entry point keeps (docs/FAILURES.md)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")
