"""--mode fsdp: one process per device, parameters sharded with FSDP2, torch DataLoaders."""
from functools import partial

from ..DDP.mode import launch
from ..train.mode import Mode


def strategy(cfg):
    from ..DDP.cifar10_loader import get_DDP_loader
    from ..data.loaders import lab_loaders
    from ..train.strategy import Strategy
    from .checkpoint import ShardedState
    from .model import model_to_FSDP
    return Strategy(wrap=model_to_FSDP, make_loaders=partial(lab_loaders, get_DDP_loader), state=ShardedState(),
                    lockstep_eval=True)


MODE = Mode(run=launch(strategy),
            sync_bn_refusal=" (FSDP shards the BatchNorm layers it would synchronise)")
