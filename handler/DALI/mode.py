"""--mode ddp_dali: ddp's processes, model and comm options, with batches from NVIDIA DALI
pipelines reading the input its own option names."""
from functools import partial

from ..DDP.mode import launch
from ..DDP.options import CommOptions, check_comm
from ..train.mode import Mode
from .options import DaliOptions


def strategy(cfg):
    from ..DDP.mode import strategy as ddp_strategy
    from ..data.loaders import lab_loaders
    from .cifar10_loader import get_DALI_loader
    return ddp_strategy(cfg, make_loaders=partial(lab_loaders, get_DALI_loader, pass_cfg=True))


def preflight(cfg) -> None:
    from .cifar10_loader import require_dali
    require_dali()


MODE = Mode(run=launch(strategy), options=(CommOptions, DaliOptions), preflight=preflight, check=check_comm,
            sync_bn=True)
