"""--mode ddp_dali: ddp's processes and model, with batches from NVIDIA DALI pipelines."""
from ..DDP.mode import launch
from ..DDP.options import check_comm
from ..train.mode import Mode


def strategy(cfg):
    from ..DDP.mode import strategy as ddp_strategy
    from .cifar10_loader import get_DALI_loader
    return ddp_strategy(cfg, make_loaders=get_DALI_loader)


def preflight(cfg) -> None:
    from .cifar10_loader import require_dali
    require_dali()


MODE = Mode(run=launch(strategy), preflight=preflight, check=check_comm, sync_bn=True, comm_hooks=True)
