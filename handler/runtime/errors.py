"""User-facing failures: one line that names the problem and the fix, never a traceback."""
import argparse
import errno
import io
import math
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
    stop exits with 128 + signal, as a killed process would; a closed stdout pipe, quietly. A
    printed name that is not UTF-8 (a file copied from an archive) is escaped, never an exception."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        yield
    except StopRequested as stop:  # the stop message and checkpoint are already out
        sys.exit(stop.exit_code)
    except UserError as err:  # several problems (import_problems): each its own line
        print("\n".join(f"{prefix}: {shown(line)}" for line in str(err).splitlines() or [""]), file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a shell tool does on SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(128 + signal.SIGPIPE)
    except OSError as err:  # after BrokenPipeError, an OSError too
        if err.errno != errno.ENAMETOOLONG:
            raise
        print(f"{prefix}: {too_long(err.filename)}", file=sys.stderr, flush=True)
        sys.exit(2)


def shown(text: str) -> str:
    """text with each byte of a file name that is not UTF-8 (Python keeps it as a lone surrogate,
    surrogateescape) written as \\xNN: a page, a print or a figure's title can then hold it."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def too_long(name: object) -> str:
    """The one line for a path the file system refuses as too long (ENAMETOOLONG): its longest name, cut
    in the middle, and how long it is."""
    longest = max(os.fsencode(str(name or "")).split(b"/"), key=len, default=b"")
    if not longest:
        return "a file name is too long for the file system (most allow 255 bytes): rename the file (or its folder) shorter"
    text = shown(os.fsdecode(longest))
    cut = f"{text[:40]}...{text[-24:]}" if len(text) > 72 else text
    return (f"the file name {cut} is too long for the file system ({len(longest)} bytes; most allow 255): "
            "rename the file (or its folder) shorter")


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose bad option (an unknown flag, a missing value) is one line naming it and --help,
    exit 2, instead of the usage block: the rule every entry point keeps (docs/FAILURES.md). A prefix
    of an option is not taken for it (allow_abbrev=False): `--gp` is named, never read as `--gpus`."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {shown(message)} (see --help)\n")


def _number(text: str, kind: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {kind}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give {kind}")
    return value


def seconds(text: str) -> float:
    """An option's seconds: finite and 0 or more (0: no limit), for `type=` of a parser."""
    value = _number(text, "seconds, 0 or more (0: no limit)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; give seconds, 0 or more (0: no limit)")
    return value


def positive_int(text: str) -> int:
    """An option's count: a whole number of 1 or more, for `type=` of a parser."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is less than 1; give 1 or more")
    return value


def positive_number(text: str) -> float:
    """An option's size or time: finite and above 0, for `type=` of a parser."""
    value = _number(text, "a number above 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0; give a number above 0")
    return value
