"""What a mode tells the harness before training: its entry, its option rules, its start-up
checks, and which of the shared options that only some modes support (--sync-bn, the comm
hooks) it accepts. Each mode's package defines one in its mode.py; handler/modes.py names
them, one line each, so shared code never imports a mode. Once training runs, the mode speaks
through its Strategy (strategy.py) instead."""
from dataclasses import dataclass
from typing import Callable


def _nothing(cfg) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Mode:
    """`run` starts the mode (the DDP family's: handler/DDP/mode.py `launch`); `check` and
    `preflight` refuse what it cannot do before any process starts; `sync_bn` and `comm_hooks`
    say whether it takes those options, and `sync_bn_refusal` why not when it refuses --sync-bn."""
    run: Callable                   # cfg -> None: start (or join) the processes and train
    check: Callable = _nothing      # cfg -> None: the mode's own option rules (UserError); validate runs it last
    preflight: Callable = _nothing  # cfg -> None: what the environment must have (an installed library)
    sync_bn: bool = False           # accepts --sync-bn (SyncBatchNorm across DDP ranks)
    sync_bn_refusal: str = ""       # the mode's own reason, added to the --sync-bn refusal
    comm_hooks: bool = False        # accepts --comm-hook and DDP's bucket options (docs/COMM.md)
