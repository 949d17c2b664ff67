"""One rank of bench.comm, run inside a host of scripts/cluster.sh: every hook in turn,
warm-up steps, then timed steps whose comm, overlap and exposed comm come from
handler/profiling/comm.py, applied to in-process timings of the same ranges a profiled
run has (`batch`, `backward`, `allreduce b{k}`; nsys would be slower than the steps).

    python -m bench.comm_worker --rank R --master HOST --port P --hooks allreduce,... --out FILE
"""
import argparse
import json
import threading
import time
from pathlib import Path
from statistics import median

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from bench.common import fixed_batches, make_optimizer
from handler.DDP.comm_hook import CommHook
from handler.DDP.model import no_buffer_sync
from handler.DDP.utils import destroy_process, initialize_group
from handler.profiling.comm import comm_stats
from handler.profiling.stats import intersect, length, merge
from handler.profiling.trace import Range
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
    ranges = [Range("backward", backward_start, backward_end), *buckets]
    stats = comm_stats(ranges, [Range("batch 0", start, end)], None)
    launches = sorted(b.start for b in buckets)
    # What comm can hide behind: backward compute between the first and the last bucket launch.
    window = length(intersect(merge([(launches[0], launches[-1])]), merge([(backward_start, backward_end)])))
    return {"step_s": (end - start) / 1e9, "comm_s": stats["seconds"], "exposed_comm_s": stats["exposed_s"],
            "window_s": window / 1e9, "buckets": stats["buckets"]}


def run_hook(hook: str, size: dict, rank: int, world: int) -> dict:
    torch.manual_seed(0)
    raw = build_model(size["model"], 10)
    comm = CommHook(name=hook, powersgd_rank=size["powersgd_rank"], powersgd_warmup=2,
                    bucket_cap_mb=size["bucket_cap_mb"])
    recorder = Recorder()
    ddp = comm.register(DistributedDataParallel(raw, **comm.ddp_options(), **no_buffer_sync()), ranges=recorder)
    optimizer = make_optimizer(raw)
    local = size["batch"] // world
    batches = [(x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local])
               for x, y in fixed_batches(size["warmup"] + size["steps"], size["batch"])]
    raw.train()
    for images, labels in batches[:size["warmup"]]:  # DDP rebuilds buckets; PowerSGD starts at step 2
        timed_step(ddp, optimizer, images, labels, recorder)
    torch.distributed.barrier()
    sent = sent_bytes()
    steps = [timed_step(ddp, optimizer, images, labels, recorder) for images, labels in batches[size["warmup"]:]]
    sent = sent_bytes() - sent
    torch.distributed.barrier()
    row = {key: median(s[key] for s in steps) for key in ("step_s", "comm_s", "exposed_comm_s", "window_s")}
    row["compute_s"] = row["step_s"] - row["exposed_comm_s"]
    row.update(hook=hook, steps=len(steps), buckets=steps[-1]["buckets"],
               bytes_per_step=sent / len(steps), images_per_s=size["batch"] / row["step_s"])
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.comm_worker", description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--master", required=True, help="rank 0's host name or address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hooks", required=True, help="comma-separated --comm-hook names, run in this order")
    p.add_argument("--size", required=True, help="JSON: model, batch, warmup, steps, bucket_cap_mb, powersgd_rank")
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes its rows here")
    args = p.parse_args(argv)
    size = json.loads(args.size)
    initialize_group(args.rank, args.master, args.port, args.world, use_cuda=False, timeout_s=120)
    try:
        rows = [run_hook(hook, size, args.rank, args.world) for hook in args.hooks.split(",")]
        if args.rank == 0:
            args.out.write_text(json.dumps({"rows": rows, "threads": torch.get_num_threads()}))
    finally:
        destroy_process()


if __name__ == "__main__":
    main()
