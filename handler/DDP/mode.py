"""--mode ddp: one process per device, DistributedDataParallel, torch DataLoaders."""
import dataclasses
from functools import partial

from ..runtime.dist import launched_by_torchrun
from ..train.mode import Mode
from .model import SYNC_BN_NOTE
from .options import CommOptions, check_comm


def launch(strategy_for):
    """The entry (Mode.run) of every mode that trains as a Strategy with one process per rank
    (ddp, ddp_dali, fsdp, pp): each rank runs `worker` (run.py). The call map from the command
    line to `fit` is in handler/DDP/__init__.py."""
    def start(cfg) -> None:
        from .utils import held_store, run_process
        from .run import worker  # on call: reading the mode table loads no trainer
        strategy = strategy_for(cfg)
        if launched_by_torchrun():  # torchrun started this process as one of the ranks
            worker(0, cfg, strategy)
            return
        with held_store(cfg.host, cfg.port) as port:  # the ranks' rendezvous store, held here
            run_process(partial(worker, strategy=strategy), dataclasses.replace(cfg, port=port),
                        nprocs=cfg.world_size, use_cuda=cfg.use_cuda)
    return start


def strategy(cfg, make_loaders=None):
    """ddp_dali passes its own loaders; the wrapping, comm hook and checkpoint state are shared."""
    from ..train.strategy import Strategy
    from .checkpoint import HookedState
    from ..data.loaders import lab_loaders
    from .cifar10_loader import get_DDP_loader
    from .comm_hook import CommHook
    from .model import model_to_DDP
    comm = CommHook.from_config(cfg)  # its memory (PowerSGD's) goes into checkpoints too
    return Strategy(wrap=partial(model_to_DDP, sync_bn=cfg.sync_bn, comm=comm),
                    make_loaders=make_loaders or partial(lab_loaders, get_DDP_loader), state=HookedState(comm),
                    notes=(SYNC_BN_NOTE,) if cfg.sync_bn and cfg.use_cuda else ())


MODE = Mode(run=launch(strategy), options=(CommOptions,), check=check_comm, sync_bn=True)
