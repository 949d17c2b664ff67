"""--mode ddp: one process per device, DistributedDataParallel, torch DataLoaders."""
from functools import partial

from ..train.mode import Mode
from .model import SYNC_BN_NOTE
from .options import CommOptions, check_comm


def launch(strategy_for):
    """The entry of every mode that trains as a Strategy with one process per rank."""
    def run(cfg) -> None:
        from .run import run as run_ranks
        run_ranks(cfg, strategy_for(cfg))
    return run


def strategy(cfg, make_loaders=None):
    """ddp_dali passes its own loaders; the wrapping, comm hook and checkpoint state are shared."""
    from ..train.strategy import Strategy
    from .checkpoint import HookedState
    from .cifar10_loader import get_DDP_loader
    from .comm_hook import CommHook
    from .model import model_to_DDP
    comm = CommHook.from_config(cfg)  # its memory (PowerSGD's) goes into checkpoints too
    return Strategy(wrap=partial(model_to_DDP, sync_bn=cfg.sync_bn, comm=comm),
                    make_loaders=make_loaders or get_DDP_loader, state=HookedState(comm),
                    notes=(SYNC_BN_NOTE,) if cfg.sync_bn and cfg.use_cuda else ())


MODE = Mode(run=launch(strategy), options=(CommOptions,), check=check_comm, sync_bn=True)
