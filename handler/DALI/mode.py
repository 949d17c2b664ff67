"""--mode ddp_dali: ddp's processes and model, with batches from NVIDIA DALI pipelines."""
from functools import partial

from ..DDP.mode import launch
from ..train.mode import Mode


def strategy(cfg):
    from ..DDP.model import model_to_DDP
    from ..train.strategy import Strategy
    from .cifar10_loader import get_DALI_loader
    return Strategy(wrap=partial(model_to_DDP, sync_bn=cfg.sync_bn), make_loaders=get_DALI_loader)


def preflight(cfg) -> None:
    from .cifar10_loader import require_dali
    require_dali()


MODE = Mode(run=launch(strategy), preflight=preflight, sync_bn=True)
