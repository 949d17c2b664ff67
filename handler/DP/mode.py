"""--mode dp: one process, nn.DataParallel over the visible GPUs (or one plain CPU process)."""
from ..train.mode import Mode
from .options import DPOptions


def run(cfg) -> None:
    from .run import run as run_dp
    run_dp(cfg)


MODE = Mode(run=run, options=(DPOptions,), one_process=True)
