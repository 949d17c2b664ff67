"""Worker functions for tests that start real gloo process groups (importable by spawn)."""
import os
import signal
import time

import torch
import torch.distributed
import torch.nn as nn
import torch.nn.functional as F

from handler.train.loop import Step, _optimise
from handler.DDP.model import model_to_DDP
from handler.DDP.utils import destroy_process, initialize_group


class TinyNet(nn.Module):
    """A small CNN without BatchNorm, so per-rank batches give exactly the full-batch gradient."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.head(F.max_pool2d(F.relu(self.conv(x)), 4).flatten(1))


def fixed_batches(steps: int, batch: int):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def train_steps(model, batches, accum_steps=1, criterion=None):
    """Run the harness's own optimisation step over the given (images, labels) batches."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    step = Step(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                scaler=torch.amp.GradScaler("cpu", enabled=False),
                autocast=lambda: torch.autocast("cpu", enabled=False), accum_steps=accum_steps,
                **({"criterion": criterion} if criterion else {}))
    for images, labels in batches:
        _optimise(step, images, labels)


def ddp_worker(proc_id, world, port, steps, batch, accum_steps, out_dir, wrap="ddp"):
    """Train TinyNet on this rank's slice of each global batch with the chosen wrapper;
    rank 0 saves the full (unsharded) parameters as <wrap>.pt."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from handler.FSDP.model import model_to_FSDP

    me = initialize_group(proc_id, "127.0.0.1", port, world, use_cuda=False, timeout_s=60)
    try:
        torch.manual_seed(0)
        raw = TinyNet()
        model = model_to_DDP(raw) if wrap == "ddp" else model_to_FSDP(raw)
        local = [(x.chunk(world)[me.rank], y.chunk(world)[me.rank]) for x, y in fixed_batches(steps, batch)]
        train_steps(model, local, accum_steps)
        full = get_model_state_dict(raw, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if me.rank == 0:
            torch.save(full, os.path.join(out_dir, f"{wrap}.pt"))
        torch.distributed.barrier()  # both ranks done with the group before either tears it down
    finally:
        destroy_process()


def bn_worker(proc_id, world, port, out_dir):
    """Train a BatchNorm net under DDP on different data per rank; rank 0 saves every
    rank's BatchNorm statistics before and after dist.broadcast_buffers."""
    from handler.runtime import dist

    me = initialize_group(proc_id, "127.0.0.1", port, world, use_cuda=False, timeout_s=60)
    try:
        torch.manual_seed(0)
        raw = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
        raw(torch.zeros(2, 3, 32, 32))  # materialise the lazy layer identically on every rank
        model = model_to_DDP(raw)
        train_steps(model, [(x + me.rank, y) for x, y in fixed_batches(3, 8)])  # each rank its own data

        def gathered():
            stats = torch.cat([raw[1].running_mean, raw[1].running_var])
            out = [torch.zeros_like(stats) for _ in range(world)]
            torch.distributed.all_gather(out, stats)
            return torch.stack(out)
        before = gathered()
        dist.broadcast_buffers(raw)
        after = gathered()
        if me.rank == 0:
            torch.save({"before": before, "after": after}, os.path.join(out_dir, "bn.pt"))
        torch.distributed.barrier()
    finally:
        destroy_process()


def all_workers(proc_id, world, ports, out_dir):
    """test_ddp_correctness's gloo checks, one after another in one spawn: starting the
    processes (a torch import each) costs more than all the checks. Each check sets up
    and tears down its own group, on its own port."""
    ddp_worker(proc_id, world, ports[0], 4, 16, 1, out_dir, "ddp")
    ddp_worker(proc_id, world, ports[1], 4, 16, 1, out_dir, "fsdp")
    os.makedirs(os.path.join(out_dir, "accum"), exist_ok=True)
    ddp_worker(proc_id, world, ports[2], 3, 16, 2, os.path.join(out_dir, "accum"), "ddp")
    bn_worker(proc_id, world, ports[3], out_dir)


def dies_when_stopped(proc_id, ready_dir):
    """A rank that a stop request kills outright (as a rank stuck in C++ is, by the second
    signal) instead of saving: SIGTERM makes it SIGKILL itself."""
    import signal
    import time
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGKILL))
    open(os.path.join(ready_dir, f"ready{proc_id}"), "w").close()
    time.sleep(60)


def kill_peer_then_exit_2(proc_id, folder):
    """Rank 1 waits; rank 0 SIGKILLs it and, once it is dead, at once exits with code 2, as a
    rank that finds a peer lost does: both end within microseconds, often before the launcher
    looks."""
    pid_file = os.path.join(folder, "rank1.pid")
    if proc_id == 1:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        time.sleep(60)
        return
    while not os.path.exists(pid_file):
        time.sleep(0.01)
    with open(pid_file) as f:
        peer = int(f.read())
    os.kill(peer, signal.SIGKILL)
    while alive(peer):  # dead (a zombie until the launcher reaps it) before this rank ends
        time.sleep(0.001)
    os._exit(2)


def alive(pid):
    """The process runs (it exists and is no zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
