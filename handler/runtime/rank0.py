"""Everything only rank 0 does: printing, progress bars, and going first (downloads)."""
import sys
from contextlib import contextmanager

from tqdm.auto import tqdm

from . import dist


def say(cfg, *lines: str, err: bool = False) -> None:
    if cfg.is_main:
        print("\n".join(lines), file=sys.stderr if err else sys.stdout, flush=True)


def banner(cfg, *lines: str) -> None:
    """A loud notice for fallbacks the user must not miss."""
    width = max(len(line) for line in lines) + 4
    say(cfg, "=" * width, *(f"  {line}" for line in lines), "=" * width, err=True)


def progress(cfg, total: int, desc: str):
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=0.5,
                disable=not (cfg.is_main and cfg.progress))


@contextmanager
def first(cfg):
    """Rank 0 runs the block while the other ranks wait; then they run it."""
    if not cfg.is_main:
        dist.barrier()
    yield
    if cfg.is_main:
        dist.barrier()
