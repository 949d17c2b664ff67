"""The DDP modes' entry: start (or join) the ranks, then train with the shared loop."""
import dataclasses

from ..common import rank0
from ..common.dataset import prepare_dataset
from ..common.errors import one_line_errors
from ..common.trainer import fit
from ..common.config import validate
from .model import model_to_DDP
from .utils import destroy_process, initialize_group, launched_by_torchrun, run_process


def run(cfg, make_loaders) -> None:
    if launched_by_torchrun():
        worker(0, cfg, make_loaders)
    else:
        run_process(worker, (cfg, make_loaders), nprocs=cfg.world_size)


def worker(proc_id: int, cfg, make_loaders) -> None:
    with one_line_errors(f"rank {proc_id}"):
        me = initialize_group(proc_id, cfg.host, cfg.port, cfg.num_gpu,
                              use_cuda=cfg.use_cuda, timeout_s=cfg.dist_timeout)
        try:
            cfg = dataclasses.replace(cfg, **dataclasses.asdict(me))
            validate(cfg)  # torchrun may have chosen a world size the command line did not
            with rank0.first(cfg):
                cfg = prepare_dataset(cfg)
            fit(cfg, wrap=model_to_DDP, make_loaders=make_loaders)
        finally:
            destroy_process()
