"""What scripts/launch.sh passes a profiled run: the user's umask, restored inside it, and
the file that says the program started.

nsys starts the program with umask 000, so without this every checkpoint, metrics file and
data folder a profiled run writes would be world-writable: anyone on a shared machine could
replace `last.pt`. scripts/launch.sh passes the shell's umask in HARNESS_UMASK and the
program applies it before it writes anything. Spawned ranks inherit it.
"""
import os
import sys
from pathlib import Path

from .errors import UserError


def apply_user_umask() -> None:
    value = os.environ.get("HARNESS_UMASK")
    if not value:
        return
    try:
        mask = int(value, 8)
    except ValueError:
        mask = -1
    if not 0 <= mask <= 0o777:
        raise UserError(f"HARNESS_UMASK='{value}' is not an octal umask such as 0022; unset it, "
                        "or let scripts/launch.sh set it from your shell's umask")
    os.umask(mask)


def say_started() -> None:
    """Touch HARNESS_STARTED: launch.sh then knows nsys started the program, and names an nsys
    that did not (its own session failure) instead of leaving a student to read a training failure."""
    path = os.environ.pop("HARNESS_STARTED", "")
    if path:
        try:
            Path(path).touch()
        except OSError as err:  # the launcher's folder is gone: only its last line would be lost
            print(f"note: could not tell launch.sh that the training started ({err})", file=sys.stderr, flush=True)
