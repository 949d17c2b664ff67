"""The user's umask, restored inside a profiled run.

nsys starts the program with umask 000, so without this every checkpoint, metrics file and
data folder a profiled run writes would be world-writable: anyone on a shared machine could
replace `last.pt`. scripts/launch.sh passes the shell's umask in HARNESS_UMASK and the
program applies it before it writes anything. Spawned ranks inherit it.
"""
import os

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
