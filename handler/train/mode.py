"""What a mode tells the harness before training: its own options, its option rules, its
start-up checks, how its processes share the batch, and its entry. Each mode's package
defines one in its mode.py; handler/modes.py names them, one line each, so shared code never
imports a mode."""
from dataclasses import dataclass
from typing import Callable


def _nothing(cfg) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Mode:
    run: Callable                   # cfg -> None: start (or join) the processes and train
    options: tuple = ()             # its own option sections (handler/train/options.py); others' are refused
    check: Callable = _nothing      # cfg -> None: the mode's own option rules (UserError); validate runs it last
    preflight: Callable = _nothing  # cfg -> None: what the environment must have (an installed library)
    sync_bn: bool = False           # accepts --sync-bn (SyncBatchNorm across DDP ranks)
    sync_bn_refusal: str = ""       # the mode's own reason, added to the --sync-bn refusal
    one_process: bool = False       # one process drives every device (DataParallel): world size 1, no torchrun
    whole_batch: bool = False       # every rank sees the whole global batch (a pipeline's stages)
