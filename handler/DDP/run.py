"""What every rank of the DDP-family modes runs: join the group, train with the shared
loop, leave. handler/DDP/mode.py `launch` starts the ranks; handler/DDP/__init__.py maps it."""
import dataclasses
import os
import socket

from ..runtime import dist, rank0, stopping
from ..modes import validate
from ..data.dataset import data_lock, prepare_dataset
from ..runtime.errors import StopRequested, one_line_errors
from ..train.trainer import fit
from . import flight_recorder, peers
from .utils import destroy_process, elastic_restart_count, initialize_group, launched_by_torchrun, store_address


def worker(proc_id: int, cfg, strategy) -> None:
    """One rank. A failing rank's line comes out before its group is taken down, and the
    group is then aborted, not drained (destroy_process): its line is never lost to a
    shutdown that waits on a dead peer."""
    ended_well = False
    try:
        with one_line_errors(f"rank {os.environ.get('RANK', proc_id)} ({socket.gethostname()})"):
            try:
                with stopping.quiet_once_ended():
                    _train(proc_id, cfg, strategy)
            except StopRequested:  # every rank stopped at the same step and saved: nothing is pending
                ended_well = True
                raise
            ended_well = True
    finally:
        destroy_process(abort=not ended_well)


def _train(proc_id: int, cfg, strategy) -> None:
    if launched_by_torchrun():
        cfg = _torchrun_preparation(cfg)
    flight_recorder.enable(cfg.ckpt, use_cuda=cfg.use_cuda)  # before the group: torch reads the settings then
    me = initialize_group(proc_id, cfg.host, cfg.port, cfg.world_size,
                          use_cuda=cfg.use_cuda, timeout_s=cfg.dist_timeout, store_held=True)
    cfg = dataclasses.replace(cfg, **dataclasses.asdict(me))
    validate(cfg)  # torchrun may have chosen a world size the command line did not
    with peers.watch(*store_address(cfg), me.rank, me.world_size, cfg.dist_timeout):
        fit(cfg, strategy)
        dist.barrier()  # no rank tears the group down while a peer still uses it


def _torchrun_preparation(cfg):
    """Under torchrun nobody prepared the data before the workers started, and after an
    elastic restart the workers continue from the last checkpoint by themselves."""
    with data_lock(cfg):
        cfg = prepare_dataset(cfg)
    restarts_allowed = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts_allowed and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1" \
            and os.environ.get("RANK") == "0" and not elastic_restart_count():
        rank0.say(cfg, "warning: restarted workers can read stale rendezvous keys (pytorch#135712); "
                       "run torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", err=True)
    last = os.path.join(cfg.ckpt, "last.pt")
    if elastic_restart_count() and cfg.resume is None and os.path.isfile(last):
        if os.environ.get("RANK") == "0":
            rank0.banner(cfg, f"elastic restart {elastic_restart_count()}: resuming from {last}")
        cfg = dataclasses.replace(cfg, resume="")
    return cfg
