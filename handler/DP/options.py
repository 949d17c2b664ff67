"""--mode dp's own option: where the loss is computed (handler/DP/balanced.py)."""
from dataclasses import dataclass

from ..train.options import Options, option


@dataclass(frozen=True, kw_only=True)
class DPOptions(Options):
    """Where DataParallel computes the loss: gathering every replica's logits on GPU 0 is the
    imbalance --dp-balanced removes."""
    TITLE = "dp"
    REFUSAL = "{flags} change{s} DataParallel; use {it} with --mode {owners}, or drop {it} for --mode {mode}"
    dp_balanced: bool = option(False, help="dp: compute the loss inside each replica instead of gathering "
                                           "logits on GPU 0")
