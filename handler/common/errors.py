"""User-facing failures: one line that names the problem and the fix, never a traceback."""
import sys
from contextlib import contextmanager


class UserError(Exception):
    """A problem the user can fix. The message says what is wrong and what to do."""


@contextmanager
def one_line_errors(prefix: str = "error"):
    """Turn UserError (and Ctrl-C) into one line on stderr and a non-zero exit."""
    try:
        yield
    except UserError as err:
        print(f"{prefix}: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
