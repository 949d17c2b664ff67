"""What a mode tells the harness before training: its entry, its own option sections and
rules, its start-up checks, how its processes share the batch, and which of the options that
only some modes support (--sync-bn, the comm hooks) it accepts. Each mode's package defines
one in its mode.py; handler/modes.py names them, one line each, so shared code never imports
a mode. Once training runs, the mode speaks through its Strategy (strategy.py) instead."""
from dataclasses import dataclass
from typing import Callable


def _nothing(cfg) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Mode:
    """`run` starts the mode (the DDP family's: handler/DDP/mode.py `launch`); `options` are the
    sections of flags only it takes; `check` and `preflight` refuse what it cannot do before any
    process starts; `sync_bn` and `comm_hooks` say whether it takes those options (and
    `sync_bn_refusal` why not); `one_process` and `whole_batch` say how its processes split the
    work, which sets the world size and each process's share of the batch."""
    run: Callable                   # cfg -> None: start (or join) the processes and train
    options: tuple = ()             # its own option sections (handler/train/options.py); others' are refused
    check: Callable = _nothing      # cfg -> None: the mode's own option rules (UserError); validate runs it last
    preflight: Callable = _nothing  # cfg -> None: what the environment must have (an installed library)
    sync_bn: bool = False           # accepts --sync-bn (SyncBatchNorm across DDP ranks)
    sync_bn_refusal: str = ""       # the mode's own reason, added to the --sync-bn refusal
    one_process: bool = False       # one process drives every device (DataParallel): world size 1, no torchrun
    whole_batch: bool = False       # every rank sees the whole global batch (a pipeline's stages)
