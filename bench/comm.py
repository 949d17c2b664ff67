"""DDP over a slow network: step time against link rate for every comm hook, two hosts.

    python -m bench.comm [--quick] [--json PATH] [--rates 1000,50,10] [--rounds N] [--steps N]

Two hosts of scripts/cluster.sh (`up --net-only`: network namespaces on a bridge, nothing
in the root namespace, addresses from 198.18.0.0/24), one rank on each, gloo over their
link, one DDP model per hook in each rank (bench/comm_worker.py). Rounds go over the rates:
rank 0 reshapes node1's link (`scripts/cluster.sh shape node1`: both directions, tbf rate,
netem delay where the kernel has netem), one untimed step lets TCP settle, then the hooks
take turns, step by step, for a few timed steps each. The rate order rotates from round to
round, so load from other jobs that comes and goes reaches every rate and hook alike.
resnet20, global batch 16, buckets of 0.25 MB (4 buckets, so backward has something to
overlap with), one thread per rank: at 10 Mbit/s plain all-reduce's exposed comm is most
of the step.

Per row: step_s (median), compute_s (step minus exposed comm), comm_s, exposed_comm_s (as
the profile report computes them from `allreduce b{k}` ranges, here timed in-process),
bytes_per_step (sent on node1's link, from its interface counters), images_per_s.
The model (bench/comm_model.py) is fitted on every rate but one and checked on that one;
then it predicts ResNet-18's scaling on real clusters. The cluster is always taken down.
"""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

from bench.common import ROOT, check_target, context, emit, parser, table
from bench.comm_model import check, fit, scaling
from handler.train.config import COMM_HOOKS
from handler.runtime.errors import UserError, one_line_errors

CLUSTER = Path(os.environ.get("HARNESS_CLUSTER_SH") or ROOT / "scripts" / "cluster.sh")
SHAPED = "node1"  # rank 0's host; its link is the path's only shaped hop
DELAY_MS = 0.5
PORT = 29400  # inside the cluster's namespaces nothing else listens
FULL: Dict[str, Any] = dict(model="resnet20", batch=16, warmup=3, rounds=10, steps=3, bucket_cap_mb=0.25, powersgd_rank=2,
            rates=(1000, 200, 50, 10), held_out=50)
QUICK: Dict[str, Any] = dict(FULL, rounds=8, rates=(1000, 50, 10))
TIMEOUT_S = 540
# The per-GPU step for the scaling table. No GPU run of this repository has measured one
# (README "GPU status"), so it is ASSUMED: ResNet-18 (CIFAR) is 0.56 GMAC per image, about
# 3.3 GFLOP per image trained; 45,000 images a 150 TFLOP epoch; at 15 TFLOP/s sustained
# (bf16 on an A100/H100 class GPU with 32x32 images) about 10 s per epoch of 175 steps.
ASSUMED_GPU_EPOCH_S = 10.0
GPU_STEPS_PER_EPOCH = 45000 // 256
LATENCY_US = 25  # assumed per-hop latency of a real cluster's TCP network inside a rack


class Cluster:
    """The verbs of scripts/cluster.sh that this bench uses, on a cluster of its own: its own
    CLUSTER_STATE folder, so a cluster someone else has up is never touched."""

    def __init__(self, script: Path, state: Path):
        if not script.is_file():
            raise UserError(f"{script} is missing: bench.comm runs on the hosts of scripts/cluster.sh "
                            "(multi-node work, issue 18); set HARNESS_CLUSTER_SH to a copy of it")
        self.script, self.env = script, {**os.environ, "CLUSTER_STATE": str(state)}

    def __call__(self, *args) -> str:
        done = subprocess.run(["bash", str(self.script), *args], cwd=ROOT, capture_output=True, text=True,
                              env=self.env)
        if done.returncode:
            raise UserError(f"scripts/cluster.sh {' '.join(args)} failed: "
                            f"{(done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]}")
        return done.stdout + done.stderr

    def start(self, node: str, argv: list, env: dict, log) -> subprocess.Popen:
        return subprocess.Popen(["bash", str(self.script), "exec", node, *argv], cwd=ROOT, env={**self.env, **env},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_workers(cluster: Cluster, size: dict, folder: Path) -> list:
    """Both ranks, every rate and hook (bench/comm_worker.py); rank 0's rows."""
    out = folder / "rows.json"
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
    worker_size = {k: size[k] for k in ("model", "batch", "warmup", "rounds", "steps", "bucket_cap_mb",
                                        "powersgd_rank")}
    procs, logs = [], []
    try:
        for rank, node in enumerate(("node1", "node2")):
            logs.append(open(folder / f"rank{rank}.log", "w+"))
            argv = [sys.executable, "-m", "bench.comm_worker", "--rank", str(rank), "--master", "node1",
                    "--port", str(PORT), "--hooks", ",".join(COMM_HOOKS), "--rates", ",".join(map(str, size["rates"])),
                    "--delay", str(DELAY_MS), "--cluster", str(cluster.script), "--size", json.dumps(worker_size),
                    "--out", str(out)]
            procs.append(cluster.start(node, argv, env, logs[-1]))
        for rank, proc in enumerate(procs):
            if proc.wait(timeout=TIMEOUT_S):
                logs[rank].seek(0)
                tail = [line for line in logs[rank].read().splitlines() if line.strip()][-1:]
                raise UserError(f"bench.comm_worker rank {rank} exited with {proc.returncode}: {tail}")
    except subprocess.TimeoutExpired:
        raise UserError(f"the ranks ran past {TIMEOUT_S} s") from None
    finally:
        for proc in procs:  # only the processes started here, by their own session
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in logs:
            log.close()
    return json.loads(out.read_text())["rows"]


def payloads(model_name: str, rank: int, cap_mb: float) -> dict:
    """Bytes each hook all-reduces per step for a model, its buckets and collectives per bucket."""
    from handler.DDP.powersgd import sent_numel
    from models import build_model
    shapes = [tuple(p.shape) for p in build_model(model_name, 10).parameters()]
    numel = sum(math.prod(s) for s in shapes)
    buckets = 1 + math.ceil(max(0.0, numel * 4 / 2**20 - 1) / cap_mb)  # DDP's first bucket holds 1 MB
    return {"allreduce": {"payload_bytes": numel * 4, "buckets": buckets, "collectives_per_bucket": 1},
            "fp16": {"payload_bytes": numel * 2, "buckets": buckets, "collectives_per_bucket": 1},
            "bf16": {"payload_bytes": numel * 2, "buckets": buckets, "collectives_per_bucket": 1},
            "powersgd": {"payload_bytes": 4 * sum(sent_numel(s, rank) for s in shapes), "buckets": buckets,
                         "collectives_per_bucket": 3}}


def targets(rows: list, model_error) -> dict:
    slow, fast = min(r["rate_mbit"] for r in rows), max(r["rate_mbit"] for r in rows)
    at = {(r["rate_mbit"], r["hook"]): r for r in rows}
    plain_slow, plain_fast = at[(slow, "allreduce")], at[(fast, "allreduce")]
    best = min((r for r in rows if r["rate_mbit"] == slow), key=lambda r: r["step_s"])
    found = {f"best hook ({best['hook']}) speed-up over allreduce at {slow:g} Mbit/s":
             check_target(plain_slow["step_s"] / best["step_s"], 1.5),
             f"allreduce exposed comm share of the step at {slow:g} Mbit/s":
             check_target(plain_slow["exposed_comm_s"] / plain_slow["step_s"], 0.5),
             f"allreduce exposed comm at {slow:g} over {fast:g} Mbit/s (s)":
             {"value": plain_slow["exposed_comm_s"], "fastest": plain_fast["exposed_comm_s"],
              "met": plain_slow["exposed_comm_s"] > plain_fast["exposed_comm_s"]}}
    if model_error is not None:
        found["model_error (held-out rate, worst hook)"] = {"value": model_error, "target": 0.15,
                                                            "met": model_error <= 0.15}
    return found


def measure(cluster: Cluster, size: dict, folder: Path) -> list:
    """The cluster is up only inside, and always taken down (SIGTERM too)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        cluster("up", "--net-only", "--nodes", "2")
        print(f"bench.comm: 2 hosts up; {size['rounds']} rounds over {', '.join(f'{r:g}' for r in size['rates'])} "
              f"Mbit/s, {size['steps']} timed steps per hook and round", flush=True)
        return run_workers(cluster, size, folder)
    finally:
        cluster("down")


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--rates", help="comma-separated Mbit/s (default: 1000,200,50,10; --quick 1000,50,10)")
    p.add_argument("--steps", type=int, help="timed steps per hook, rate and round")
    p.add_argument("--rounds", type=int, help="rounds over the rates (full 10, --quick 8)")
    p.add_argument("--gpu-epoch-s", type=float,
                   help=f"a measured 1-GPU ResNet-18 epoch (45,000 images, batch 256) for the scaling table "
                        f"(default: ASSUMED {ASSUMED_GPU_EPOCH_S:g} s, see docs/COMM.md)")
    args = p.parse_args(argv)
    started = context("comm")
    size = dict(QUICK if args.quick else FULL)
    if args.rates:
        size["rates"] = tuple(float(r) for r in args.rates.split(","))
    size.update({k: getattr(args, k) for k in ("steps", "rounds") if getattr(args, k)})
    with tempfile.TemporaryDirectory(prefix="bench-comm-") as folder:
        rows = measure(Cluster(CLUSTER, Path(folder) / "cluster"), size, Path(folder))
    applied = {r["delay_ms"] for r in rows}
    mine = payloads(size["model"], size["powersgd_rank"], size["bucket_cap_mb"])
    for r in rows:
        r["payload_bytes_per_step"] = mine[r["hook"]]["payload_bytes"]
    model = modelled(rows, size, mine, args.gpu_epoch_s)
    env = {"cluster": str(CLUSTER), "shaped": f"{SHAPED}'s link, both directions", "delay_requested_ms": DELAY_MS,
           "delay_applied_ms": sorted(applied), "ranks": 2, "threads_per_rank": 1, "timing": TIMING,
           **{k: size[k] for k in ("model", "batch", "warmup", "rounds", "steps", "bucket_cap_mb", "powersgd_rank")}}
    if applied != {DELAY_MS}:
        env["note"] = (f"the kernel applied no {DELAY_MS} ms delay (no netem, CONFIG_NET_SCH_NETEM): rates are "
                       "shaped, latency is the bare veth's; the model's latency term is untested here")
    model_error = model.pop("error")
    results = {"rows": rows, "model_error": model_error, "model": model, "env": env,
               "targets": targets(rows, model_error)}
    return emit("comm", results, args, report(results), started)


def modelled(rows: list, size: dict, mine: dict, gpu_epoch_s) -> dict:
    """The model fitted on all rates, checked with each rate held out (the designated one,
    between two fitted rates, gives model_error), and its ResNet-18 scaling prediction."""
    rates = sorted({r["rate_mbit"] for r in rows})
    held_out = size["held_out"] if size["held_out"] in rates[1:-1] else None
    if held_out is None and len(rates) > 2:
        held_out = rates[len(rates) // 2]
    checks = [check(rows, rate) for rate in rates] if len(rates) > 2 else []
    error = next((c["worst"] for c in checks if c["held_out_mbit"] == held_out), None)
    params = fit(rows) if len(rates) > 1 else None
    prediction = None
    if params:
        params["hooks"]["allreduce"]["payload_bytes"] = mine["allreduce"]["payload_bytes"]
        gpu_step = (gpu_epoch_s or ASSUMED_GPU_EPOCH_S) / GPU_STEPS_PER_EPOCH
        prediction = scaling(params, payloads("resnet18", size["powersgd_rank"], 25.0), gpu_step, LATENCY_US * 1e-6)
        prediction["assumptions"] = assumptions(gpu_epoch_s, gpu_step)
    return {"formula": FORMULA, "held_out_mbit": held_out, "error": error, "fit_all_rates": params,
            "checks": checks, "scaling": prediction}


FORMULA = "step = compute + max(0, max(floor, beta * wire_bytes * 8 / rate + messages * latency) - window)"
TIMING = ("in-process perf_counter timings of the ranges a profiled run marks (batch, backward, allreduce b{k}), "
          "reduced by handler/profiling/comm.py's comm_stats, per step; medians over the timed steps")


def assumptions(measured_epoch_s, step_s: float) -> list:
    epoch = f"MEASURED 1-GPU epoch {measured_epoch_s:g} s" if measured_epoch_s else (
        f"ASSUMED 1-GPU epoch {ASSUMED_GPU_EPOCH_S:g} s (no GPU run in this repository; an estimate from "
        "3.3 GFLOP per image at 15 TFLOP/s)")
    return [f"per-GPU step {step_s * 1e3:.0f} ms = {epoch} / {GPU_STEPS_PER_EPOCH} steps of 256 images",
            "weak scaling: every GPU keeps 256 images per step; one GPU per node; ring all-reduce, "
            "2(n-1)/n of the payload per GPU",
            f"latency {LATENCY_US} us per ring hop (assumed, not measured)",
            "overlap window: the share of the step it had in the fitted rows (resnet20 on CPU)",
            "link efficiency beta and wire overhead as fitted on the shaped veth (TCP); compression "
            "compute on the GPU left out (unmeasured)"]


def report(results: dict) -> str:
    rows = results["rows"]
    lines = [f"{results['env']['model']}, global batch {results['env']['batch']}, buckets "
             f"{results['env']['bucket_cap_mb']} MB, 2 hosts x 1 rank x 1 thread, gloo; {TIMING}",
             table(["Mbit/s", "delay ms", "hook", "step s", "compute s", "comm s", "exposed s", "MB/step", "img/s"],
                   [(r["rate_mbit"], r["delay_ms"], r["hook"], r["step_s"], r["compute_s"], r["comm_s"],
                     r["exposed_comm_s"], r["bytes_per_step"] / 1e6, r["images_per_s"]) for r in rows])]
    if results["env"].get("note"):
        lines.append(f"NOTE: {results['env']['note']}")
    model = results["model"]
    for c in model["checks"]:
        lines.append(f"model fitted without {c['held_out_mbit']:g} Mbit/s, predicting it: "
                     + ", ".join(f"{h} {e['predicted_s']:.3f} s vs {e['measured_s']:.3f} s ({100 * e['error']:.0f} %)"
                                 for h, e in c["per_hook"].items()))
    if results["model_error"] is not None:
        lines.append(f"model_error (held out {model['held_out_mbit']:g} Mbit/s, worst hook): "
                     f"{results['model_error']:.3f}")
    scaled = model["scaling"]
    if scaled:
        lines.append("Predicted scaling efficiency, ResNet-18, weak scaling (UNVERIFIED: "
                     + "; ".join(scaled["assumptions"]) + ")")
        for hook in ("allreduce", "bf16", "powersgd"):
            eff = scaled["efficiency"][hook]
            lines.append(f"{hook}:\n" + table(["nodes", *(f"{g} Gbit/s" for g in scaled["gbits"])],
                                              [(n, *(f"{100 * eff[f'{n}x{g}']:.0f} %" for g in scaled["gbits"]))
                                               for n in scaled["nodes"]]))
    lines += [f"{k}: {t['value']:.3f}  {'met' if t['met'] else 'MISSED'}" for k, t in results["targets"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    with one_line_errors("bench.comm"):
        main()
