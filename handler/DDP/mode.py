"""--mode ddp: one process per device, DistributedDataParallel, torch DataLoaders."""
from functools import partial

from ..train.mode import Mode


def launch(strategy_for):
    """The entry of every mode that trains as a Strategy with one process per rank."""
    def run(cfg) -> None:
        from .run import run as run_ranks
        run_ranks(cfg, strategy_for(cfg))
    return run


def strategy(cfg):
    from ..train.strategy import Strategy
    from .cifar10_loader import get_DDP_loader
    from .model import model_to_DDP
    return Strategy(wrap=partial(model_to_DDP, sync_bn=cfg.sync_bn), make_loaders=get_DDP_loader)


MODE = Mode(run=launch(strategy), sync_bn=True)
