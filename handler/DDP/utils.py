"""Process setup and teardown for the DDP modes: the one place that knows about them.

Single node: `run_process` starts one process per device with mp.spawn. Under torchrun
(RANK/WORLD_SIZE/LOCAL_RANK set) the processes already exist and join the group
through the environment instead.
"""
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from ..common.devices import cuda_status
from ..common.errors import UserError


@dataclass(frozen=True)
class Rank:
    rank: int
    local_rank: int
    world_size: int
    device: str
    backend: str


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def run_process(func, args: tuple, nprocs: int) -> None:
    """Run func(proc_id, *args) in nprocs fresh processes; fail as soon as one fails."""
    try:
        mp.start_processes(func, args=args, nprocs=nprocs, join=True, start_method="spawn")
    except mp.ProcessExitedException as err:
        # exit code 2: the rank already printed its one-line reason (UserError).
        if err.exit_code == 2:
            raise SystemExit(2) from None
        how = f"was killed by {err.signal_name}" if err.signal_name else f"exited with code {err.exit_code}"
        raise UserError(f"rank {err.error_index} {how}; the other ranks were stopped") from None


def initialize_group(proc_id: int, host: str, port: int, num_gpu: int, *,
                     use_cuda: bool, timeout_s: float) -> Rank:
    """Pick this process's device, join the process group, and wait for every peer."""
    cuda_status()  # probe CUDA once, quietly: the group's barrier asks again
    if launched_by_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        init_method = "env://"
    else:
        rank, world, local_rank, local_world = proc_id, num_gpu, proc_id, num_gpu
        init_method = f"tcp://{host}:{port}"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device, backend = f"cuda:{local_rank}", "nccl"
    else:
        # Ranks on one machine share its cores; more threads than cores only thrash.
        # An explicit OMP_NUM_THREADS (torchrun sets one) wins.
        threads = os.environ.get("OMP_NUM_THREADS") or (os.cpu_count() or 1) // local_world
        torch.set_num_threads(max(1, int(threads)))
        device, backend = "cpu", "gloo"
    tdist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=timeout_s),
                             device_id=torch.device(device) if use_cuda else None)
    tdist.barrier()
    return Rank(rank=rank, local_rank=local_rank, world_size=world, device=device, backend=backend)


def destroy_process() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()
