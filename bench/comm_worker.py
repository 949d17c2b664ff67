"""One rank of bench.comm, run inside a host of scripts/cluster.sh: one DDP model per hook,
warm-up steps, then rounds over the links' (rate, delay) cells, timed steps whose comm, overlap
and exposed comm come from handler/profiling/comm.py, applied to in-process timings of the same ranges a
profiled run has (`batch`, `backward`, `allreduce b{k}`; nsys would be slower than the steps).

    python -m bench.comm_worker --rank R --world N --master HOST --port P --hooks H,... --cells RATE:DELAY,... ...
"""
import argparse
import gc
import json
import math
import re
import subprocess
import threading
import time
from pathlib import Path
from statistics import median

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from bench.common import fixed_batches, make_optimizer
from handler.runtime.errors import OneLineParser
from handler.DDP.comm_hook import CommHook
from handler.DDP.options import CommOptions
from handler.DDP.model import no_buffer_sync
from handler.DDP.utils import destroy_process, initialize_group
from handler.profiling.comm import comm_stats
from handler.profiling.stats import intersect, length, merge
from handler.profiling.trace import Range
from handler.runtime.names import BACKWARD, BATCH
from models import build_model

IFNAME = "eth0"  # every host's interface (scripts/cluster.sh)


class Recorder:
    """start/end ranges with the clock DDP's threads share; stands in for NVTX."""

    def __init__(self):
        self.ranges, self._lock = [], threading.Lock()

    def start(self, name):
        return name, time.perf_counter_ns()

    def end(self, handle):
        name, start = handle
        with self._lock:
            self.ranges.append(Range(name, start, time.perf_counter_ns()))

    def take(self) -> list:
        with self._lock:
            taken, self.ranges = self.ranges, []
        return taken


def sent_bytes(ifname: str = IFNAME) -> int:
    """Bytes this host has sent on its link (/proc/net/dev is per network namespace)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == ifname:
            return int(counters.split()[8])
    raise SystemExit(f"bench.comm_worker: no interface {ifname} here; run it inside a cluster host")


def timed_step(ddp, optimizer, images, labels, recorder) -> dict:
    """One training step as the loop runs it (AMP off), and its comm numbers."""
    start = time.perf_counter_ns()
    loss = F.cross_entropy(ddp(images), labels)
    backward_start = time.perf_counter_ns()
    loss.backward()  # returns once every bucket's exchange has completed
    backward_end = time.perf_counter_ns()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    end = time.perf_counter_ns()
    buckets = recorder.take()
    ranges = [Range(BACKWARD, backward_start, backward_end), *buckets]
    stats = comm_stats(ranges, [Range(BATCH(0), start, end)], None)
    assert stats is not None, "the recorder saw the buckets' allreduce ranges"
    launches = sorted(b.start for b in buckets)
    # What comm can hide behind: backward compute between the first and the last bucket launch.
    window = length(intersect(merge([(launches[0], launches[-1])]), merge([(backward_start, backward_end)])))
    return {"step_s": (end - start) / 1e9, "comm_s": stats["seconds"], "exposed_comm_s": stats["exposed_s"],
            "window_s": window / 1e9, "buckets": stats["buckets"]}


class Hooked:
    """One hook's model, optimizer and batches, kept across the rounds; its DDP wrapper is
    built anew on each cell's own process group (`wire`)."""

    def __init__(self, hook: str, size: dict, rank: int, world: int):
        torch.manual_seed(0)
        self.raw = build_model(size["model"], 10)
        self.comm = CommHook(CommOptions(comm_hook=hook, powersgd_rank=size["powersgd_rank"], powersgd_warmup=2,
                                         bucket_cap_mb=size["bucket_cap_mb"]))
        self.recorder = Recorder()
        self.ddp = None
        self.optimizer = make_optimizer(self.raw)
        local = size["batch"] // world
        self.batches = [(x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local])
                        for x, y in fixed_batches(4, size["batch"])]
        self.done = 0
        self.raw.train()

    def wire(self, group) -> None:
        """DDP over `group`. The ranks' weights are equal already (same seed, same updates), so
        no broadcast: at 10 Mbit/s it would take a second. PowerSGD keeps its state."""
        first, self.ddp = self.ddp is None, None
        gc.collect()  # the old DDP's reducer, and its gradient hooks, go before the new one hooks in
        ddp = DistributedDataParallel(self.raw, process_group=group, init_sync=first,
                                      **self.comm.ddp_options(), **no_buffer_sync())
        self.ddp = self.comm.register(ddp, ranges=self.recorder, group=group)

    def step(self) -> dict:
        images, labels = self.batches[self.done % len(self.batches)]
        self.done += 1
        return timed_step(self.ddp, self.optimizer, images, labels, self.recorder)


def shape(cluster: str, rate: float, delay_ms: float) -> float:
    """Rank 0 reshapes every host's link alike with scripts/cluster.sh (the verb works from inside
    a host); returns the delay applied."""
    said = subprocess.run(["bash", cluster, "shape", "--rate", f"{rate:g}mbit", "--delay", f"{delay_ms:g}ms"],
                          capture_output=True, text=True, check=True)
    found = re.search(r"delay ([\d.]+) ms each way", said.stdout + said.stderr)
    return float(found.group(1)) if found else math.nan


def fresh_group(old=None):
    """A new gloo group: new TCP connections, opened on the link as it is now. A connection
    carried over from another (rate, delay) cell brings that cell's congestion window and
    round-trip estimate along. Measured with 4 async all-reduces of 0.27 MB, as DDP's buckets:
    on connections from 1000 Mbit/s 0 ms, 50 Mbit/s 5 ms took 0.22-0.28 s for a few steps,
    then 0.8-1.0 s for about 10 s (a spurious retransmission timeout, the window then held
    near 20 segments), then 0.25 s; on connections opened at 50/5, 0.22 s from the first step
    on (docs/COMM.md, "Fresh connections per cell")."""
    if old is not None:
        torch.distributed.destroy_process_group(old)
    return torch.distributed.new_group(backend="gloo")


def measure(size: dict, hooks: list, cells: list, rank: int, world: int, cluster: str) -> list:
    """Rounds over the (rate, delay) cells (the order rotating), and in each cell's block the
    hooks step by step, so load that drifts over minutes reaches every cell and hook alike.
    Each cell runs on connections opened after its reshaping (fresh_group); one untimed step
    per hook builds DDP's buckets on them and lets TCP settle."""
    models = {hook: Hooked(hook, size, rank, world) for hook in hooks}
    group = fresh_group()
    for m in models.values():
        m.wire(group)
        for _ in range(size["warmup"]):  # DDP rebuilds its buckets; PowerSGD compresses from step 2
            m.step()
    steps = {(cell, hook): [] for cell in cells for hook in hooks}
    sent = {key: 0 for key in steps}
    applied = {}
    for r in range(size["rounds"]):
        for cell in cells[r % len(cells):] + cells[:r % len(cells)]:
            if rank == 0:
                applied[cell] = shape(cluster, *cell)
            torch.distributed.barrier()
            group = fresh_group(group)
            order = hooks[r % len(hooks):] + hooks[:r % len(hooks)]
            for hook in order:
                models[hook].wire(group)
                models[hook].step()
            for _ in range(size["steps"]):
                for hook in order:  # step by step, so load that comes and goes hits every hook
                    before = sent_bytes()
                    steps[(cell, hook)].append(models[hook].step())
                    sent[(cell, hook)] += sent_bytes() - before
            torch.distributed.barrier()
    return [row(cell, hook, timed, sent[(cell, hook)], applied.get(cell), world, size["batch"])
            for (cell, hook), timed in steps.items()]


def row(cell: tuple, hook: str, timed: list, sent: int, applied, world: int, batch: int) -> dict:
    """One (rate, delay, hook) cell's medians over its timed steps."""
    medians = {key: median(s[key] for s in timed) for key in ("step_s", "comm_s", "exposed_comm_s", "window_s")}
    medians["compute_s"] = medians["step_s"] - medians["exposed_comm_s"]
    return {"hosts": world, "rate_mbit": cell[0], "delay_requested_ms": cell[1], "delay_ms": applied, "hook": hook,
            **medians, "steps": len(timed), "buckets": timed[-1]["buckets"], "bytes_per_step": sent / len(timed),
            "images_per_s": batch / medians["step_s"]}


def cells_arg(text: str) -> list:
    """"1000:0,50:1" -> [(1000.0, 0.0), (50.0, 1.0)]: Mbit/s and ms of delay each way."""
    return [tuple(float(v) for v in cell.split(":")) for cell in text.split(",")]


def main(argv=None) -> None:
    p = OneLineParser(prog="python -m bench.comm_worker", description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--master", required=True, help="rank 0's host name or address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hooks", required=True, help="comma-separated --comm-hook names")
    p.add_argument("--cells", type=cells_arg, required=True,
                   help="comma-separated RATE:DELAY, Mbit/s and ms each way for every host's link")
    p.add_argument("--cluster", required=True, help="scripts/cluster.sh, for rank 0 to reshape its link")
    p.add_argument("--size", required=True,
                   help="JSON: model, batch, warmup, rounds, steps, bucket_cap_mb, powersgd_rank")
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes its rows here")
    args = p.parse_args(argv)
    initialize_group(args.rank, args.master, args.port, args.world, use_cuda=False, timeout_s=300)
    try:
        rows = measure(json.loads(args.size), args.hooks.split(","), args.cells, args.rank, args.world,
                       args.cluster)
        if args.rank == 0:
            args.out.write_text(json.dumps({"rows": rows, "threads": torch.get_num_threads()}))
    finally:
        destroy_process()


if __name__ == "__main__":
    main()
