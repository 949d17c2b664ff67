"""Which code runs each --mode. Each DDP-style mode is a Strategy for the shared loop."""
from functools import partial

from .common.strategy import Strategy


def strategy_for(cfg) -> Strategy:
    from .DDP.cifar10_loader import get_DDP_loader
    from .DDP.model import model_to_DDP
    if cfg.mode == "ddp":
        return Strategy(wrap=partial(model_to_DDP, sync_bn=cfg.sync_bn), make_loaders=get_DDP_loader)
    if cfg.mode == "ddp_dali":
        from .DALI.cifar10_loader import get_DALI_loader
        return Strategy(wrap=partial(model_to_DDP, sync_bn=cfg.sync_bn), make_loaders=get_DALI_loader)
    if cfg.mode == "fsdp":
        from .FSDP.checkpoint import ShardedState
        from .FSDP.model import model_to_FSDP
        return Strategy(wrap=model_to_FSDP, make_loaders=get_DDP_loader, state=ShardedState(),
                        lockstep_eval=True)
    if cfg.mode == "pp":
        from .PP.strategy import pipeline_strategy
        return pipeline_strategy(cfg)
    raise ValueError(cfg.mode)


def run_mode(cfg) -> None:
    if cfg.mode == "dp":
        from .DP.run import run
        return run(cfg)
    from .DDP.run import run
    run(cfg, strategy_for(cfg))
