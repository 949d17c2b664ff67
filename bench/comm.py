"""DDP over a slow network: step time against link rate and delay for every comm hook, on 2
hosts and on more (--hosts, default 4), and a cost model fitted on 2 hosts that predicts both.

    python -m bench.comm [--quick] [--json PATH] [--rates 1000,50,10] [--delays 0,1,5] [--hosts N]
                         [--rounds N] [--steps N]

Hosts of scripts/cluster.sh (`up --net-only --nodes N`: network namespaces on a bridge,
nothing in the root namespace, addresses from 198.18.0.0/24), one rank on each, gloo over
their links, one DDP model per hook in each rank (bench/comm_worker.py). Rounds go over the
(rate, delay) cells: rank 0 reshapes every host's link (`scripts/cluster.sh shape`: both
directions, tbf rate, delay by netem or the cluster's delay line), the ranks open new
connections on the new link (a new gloo group: TCP's state from the cell before would skew
this one), one untimed step per hook lets TCP settle, then the hooks take turns, step by
step, for a few timed steps each. The cell order
rotates from round to round, so load from other jobs that comes and goes reaches every cell
and hook alike. Every host's link is shaped alike (rate and delay), so each ring hop costs
the same: the case the ring formula describes. resnet20, global batch 16 per 2 hosts (8 per rank at any host count),
buckets of 0.25 MB (4 buckets, so backward has something to overlap with), one thread per
rank: at 10 Mbit/s plain all-reduce's exposed comm is most of the step.

Per row: hosts, rate, delay, step_s (median), compute_s (step minus exposed comm), comm_s,
exposed_comm_s (as the profile report computes them from `allreduce b{k}` ranges, here timed
in-process), bytes_per_step (sent on node1's link, from its interface counters), images_per_s.
The model (handler/profiling/scaling/comm_model.py) is fitted on every 2-host cell but one and checked on that
one (model_error); fitted on all 2-host cells it predicts the other host count
(hosts_prediction_error), then ResNet-18's scaling on real clusters. The cluster is always
taken down.
"""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, check_target, context, emit, parser, table
from handler.profiling.scaling.comm_model import check, fit, predict_hosts, ring_messages, scaling
from handler.DDP.options import COMM_HOOKS
from handler.runtime.errors import UserError, one_line_errors, positive_int, positive_number

CLUSTER = Path(os.environ.get("HARNESS_CLUSTER_SH") or ROOT / "scripts" / "cluster.sh")
SHAPED = "every host's link, both directions, alike"  # so each ring hop costs the same: the ring formula's case
PORT = 29400  # inside the cluster's namespaces nothing else listens
FULL: dict[str, Any] = dict(model="resnet20", batch=16, warmup=3, rounds=4, steps=3, bucket_cap_mb=0.25, powersgd_rank=2,
            rates=(1000, 200, 50, 10), delays=(0, 1, 5), held_out=(50, 1), hosts=4, hosts_rounds=3, hosts_cells=4)
QUICK: dict[str, Any] = dict(FULL, rounds=2, steps=2, rates=(1000, 50, 10), hosts_rounds=1, hosts_cells=3)
TIMEOUT_S = 540
# The per-GPU step for the scaling table. No GPU run of this repository has measured one
# (README "GPU status"), so it is ASSUMED: ResNet-18 (CIFAR) is 0.56 GMAC per image, about
# 3.3 GFLOP per image trained; 45,000 images a 150 TFLOP epoch; at 15 TFLOP/s sustained
# (bf16 on an A100/H100 class GPU with 32x32 images) about 10 s per epoch of 175 steps.
ASSUMED_GPU_EPOCH_S = 10.0
GPU_STEPS_PER_EPOCH = 45000 // 256
# A real rack's one-way host-to-host latency over TCP, ASSUMED (20 us, two switch ports of 10):
# each hook's fitted kappa says how many port delays a message waits, alpha what it costs beside them.
PORT_LATENCY_US = 10


class Cluster:
    """The verbs of scripts/cluster.sh that this bench uses, on a cluster of its own: its own
    CLUSTER_STATE folder, so a cluster someone else has up is never touched."""

    def __init__(self, script: Path, state: Path):
        if not script.is_file():
            raise UserError(f"{script} is missing: bench.comm runs on the hosts of scripts/cluster.sh "
                            "(docs/MULTINODE.md); set HARNESS_CLUSTER_SH to a copy of it")
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


def run_workers(cluster: Cluster, size: dict, cells: list, hosts: int, folder: Path) -> list:
    """One rank on each of node1..nodeHOSTS, every cell and hook (bench/comm_worker.py); rank 0's rows."""
    out = folder / f"rows-{hosts}.json"
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
    worker_size = {k: size[k] for k in ("model", "warmup", "steps", "bucket_cap_mb", "powersgd_rank")}
    worker_size.update(batch=size["batch"] * hosts // 2, rounds=size["rounds" if hosts == 2 else "hosts_rounds"])
    procs, logs = [], []
    try:
        for rank in range(hosts):
            logs.append(open(folder / f"rank{rank}-of-{hosts}.log", "w+"))
            argv = [sys.executable, "-m", "bench.comm_worker", "--rank", str(rank), "--world", str(hosts),
                    "--master", "node1", "--port", str(PORT), "--hooks", ",".join(COMM_HOOKS),
                    "--cells", ",".join(f"{r:g}:{d:g}" for r, d in cells), "--cluster", str(cluster.script),
                    "--size", json.dumps(worker_size), "--out", str(out)]
            procs.append(cluster.start(f"node{rank + 1}", argv, env, logs[-1]))
        for rank, proc in enumerate(procs):
            if proc.wait(timeout=TIMEOUT_S):
                logs[rank].seek(0)
                tail = [line for line in logs[rank].read().splitlines() if line.strip()][-1:]
                raise UserError(f"bench.comm_worker rank {rank} of {hosts} exited with {proc.returncode}: {tail}")
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


def grid(size: dict) -> list:
    """The 2-host cells: every rate at every delay."""
    return [(float(r), float(d)) for r in size["rates"] for d in size["delays"]]


def hosts_grid(size: dict) -> list:
    """The other host count's cells: the fast undelayed one (its calibration), the slowest rate
    and the longest delay (each term of the model has a cell to predict), then the held-out cell."""
    fast, slow, far = max(size["rates"]), min(size["rates"]), max(size["delays"])
    cells = [(fast, 0.0), (slow, 0.0), (fast, far), tuple(map(float, size["held_out"]))]
    return [c for k, c in enumerate(cells) if c not in cells[:k]][:size["hosts_cells"]]


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


def targets(rows: list, model_error, hosts_error) -> dict:
    least = min(r["delay_requested_ms"] for r in rows)  # 0 unless --delays leaves it out
    two = [r for r in rows if r["hosts"] == 2 and r["delay_requested_ms"] == least]
    slow, fast = min(r["rate_mbit"] for r in two), max(r["rate_mbit"] for r in two)
    at = {(r["rate_mbit"], r["hook"]): r for r in two}
    plain_slow, plain_fast = at[(slow, "allreduce")], at[(fast, "allreduce")]
    best = min((r for r in two if r["rate_mbit"] == slow), key=lambda r: r["step_s"])
    found = {f"best hook ({best['hook']}) speed-up over allreduce at {slow:g} Mbit/s":
             check_target(plain_slow["step_s"] / best["step_s"], 1.5),
             f"allreduce exposed comm share of the step at {slow:g} Mbit/s":
             check_target(plain_slow["exposed_comm_s"] / plain_slow["step_s"], 0.5),
             f"allreduce exposed comm at {slow:g} over {fast:g} Mbit/s (s)":
             {"value": plain_slow["exposed_comm_s"], "fastest": plain_fast["exposed_comm_s"],
              "met": plain_slow["exposed_comm_s"] > plain_fast["exposed_comm_s"]}}
    for name, error in (("model_error (held-out rate and delay, worst hook)", model_error),
                        ("hosts_prediction_error (more hosts from the 2-host fit, worst cell)", hosts_error)):
        if error is not None:
            found[name] = {"value": error, "target": 0.15, "met": error <= 0.15}
    return found


def measure(cluster: Cluster, size: dict, folder: Path) -> list:
    """2 hosts, then size["hosts"]; the cluster is up only inside, and always taken down (SIGTERM too)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        cluster("up", "--net-only", "--nodes", str(max(2, size["hosts"])))
        print(f"bench.comm: {max(2, size['hosts'])} hosts up; 2 hosts: {size['rounds']} rounds over "
              f"{', '.join(f'{r:g}' for r in size['rates'])} Mbit/s x {', '.join(f'{d:g}' for d in size['delays'])} "
              f"ms, {size['steps']} timed steps per hook and round", flush=True)
        rows = run_workers(cluster, size, grid(size), 2, folder)
        if size["hosts"] > 2:
            print(f"bench.comm: {size['hosts']} hosts: {size['hosts_rounds']} rounds over "
                  f"{hosts_grid(size)} (Mbit/s, ms)", flush=True)
            rows += run_workers(cluster, size, hosts_grid(size), size["hosts"], folder)
        return rows
    finally:
        cluster("down")


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--rates", help="comma-separated Mbit/s (default: 1000,200,50,10; --quick 1000,50,10)")
    p.add_argument("--delays", help="comma-separated ms each way on node1's link (default 0,1,5)")
    p.add_argument("--hosts", type=int, help="the host count predicted from the 2-host fit (default 4; 2: none)")
    p.add_argument("--steps", type=positive_int, help="timed steps per hook, cell and round")
    p.add_argument("--rounds", type=positive_int, help="rounds over the 2-host cells (full 4, --quick 2)")
    p.add_argument("--gpu-epoch-s", type=positive_number,
                   help=f"a measured 1-GPU ResNet-18 epoch (45,000 images, batch 256) for the scaling table "
                        f"(default: ASSUMED {ASSUMED_GPU_EPOCH_S:g} s, see docs/COMM.md)")
    args = p.parse_args(argv)
    started = context("comm")
    size = sized(args)
    with tempfile.TemporaryDirectory(prefix="bench-comm-") as folder:
        rows = measure(Cluster(CLUSTER, Path(folder) / "cluster"), size, Path(folder))
    mine = payloads(size["model"], size["powersgd_rank"], size["bucket_cap_mb"])
    for r in rows:
        r["payload_bytes_per_step"] = mine[r["hook"]]["payload_bytes"]
        r["collectives_per_bucket"] = mine[r["hook"]]["collectives_per_bucket"]
        r["messages"] = ring_messages(r["hosts"], r["buckets"], r["collectives_per_bucket"])
    model = modelled(rows, size, mine, args.gpu_epoch_s)
    env = {"cluster": str(CLUSTER), "shaped": SHAPED, "ranks_per_host": 1,
           "hosts": sorted({r["hosts"] for r in rows}), "threads_per_rank": 1, "timing": TIMING,
           "delays_applied_ms": sorted({r["delay_ms"] for r in rows if r["delay_ms"] is not None}),
           **{k: size[k] for k in ("model", "batch", "warmup", "rounds", "hosts_rounds", "steps", "bucket_cap_mb",
                                   "powersgd_rank")}}
    missed = [r for r in rows if r["delay_ms"] != r["delay_requested_ms"]]
    if missed:
        env["note"] = (f"{len(missed)} row(s) did not get the delay asked for (scripts/cluster.sh shape said "
                       f"{sorted({r['delay_ms'] for r in missed})} ms): the latency fit is unreliable")
    model_error, hosts_error = model.pop("error"), model["hosts_prediction"]["worst"] if model["hosts_prediction"] else None
    results = {"rows": rows, "model_error": model_error, "hosts_prediction_error": hosts_error, "model": model,
               "env": env, "targets": targets(rows, model_error, hosts_error)}
    return emit("comm", results, args, report(results), started)


def numbers(text: str, flag: str, kind: str, above_zero: bool = False) -> tuple[float, ...]:
    """A comma-separated list of finite numbers (above 0, or 0 or more); UserError naming the flag and kind."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and (v > 0 if above_zero else v >= 0) for v in values):
        raise UserError(f"{flag} {text!r} is not a list of {kind}")
    return values


def sized(args) -> dict[str, Any]:
    size: dict[str, Any] = dict(QUICK if args.quick else FULL)
    if args.rates:
        size["rates"] = numbers(args.rates, "--rates", "Mbit/s above 0, e.g. --rates 1000,50", above_zero=True)
    if args.delays:
        size["delays"] = numbers(args.delays, "--delays", "ms each way, 0 or more, e.g. --delays 0,5")
    if args.hosts is not None:
        if not 2 <= args.hosts <= 16:
            raise UserError(f"--hosts {args.hosts}: use 2..16 (one rank per host; 2 fits the model, more checks it)")
        size["hosts"] = args.hosts
    size.update({k: getattr(args, k) for k in ("steps", "rounds") if getattr(args, k)})
    if tuple(size["held_out"]) not in grid(size):  # the designated cell is not in a custom grid: the middle one
        size["held_out"] = grid(size)[len(grid(size)) // 2]
    return size


def modelled(rows: list, size: dict, mine: dict, gpu_epoch_s) -> dict:
    """The model fitted on all 2-host cells, checked with each cell held out (the designated one
    gives model_error), its prediction of the other host count, and ResNet-18's scaling."""
    two = [r for r in rows if r["hosts"] == 2]
    cells = sorted({(r["rate_mbit"], r["delay_requested_ms"]) for r in two})
    held_out = tuple(size["held_out"])
    checks = [check(two, c) for c in cells] if len(cells) > 2 else []
    error = next((c["worst"] for c in checks if tuple(c["held_out"]) == held_out), None)
    params = fit(two) if len(cells) > 1 else None
    prediction = hosts = None
    more = [r for r in rows if r["hosts"] > 2]
    if params and more:
        hosts = predict_hosts(params, more, (max(size["rates"]), 0.0))
    if params:
        params["hooks"]["allreduce"]["payload_bytes"] = mine["allreduce"]["payload_bytes"]
        gpu_step = (gpu_epoch_s or ASSUMED_GPU_EPOCH_S) / GPU_STEPS_PER_EPOCH
        prediction = scaling(params, payloads("resnet18", size["powersgd_rank"], 25.0), gpu_step,
                             PORT_LATENCY_US * 1e-6)
        prediction["assumptions"] = assumptions(gpu_epoch_s, gpu_step, params)
    return {"formula": FORMULA, "held_out": list(held_out), "error": error, "fit_all_cells": params,
            "checks": checks, "hosts_prediction": hosts, "scaling": prediction}


FORMULA = ("step = compute + max(0, comm - window); comm = smax_p(floor[hook] + messages * L, beta * wire_bytes * 8 "
           "/ rate + messages / buckets * L), smax_p(a, b) = (a^p + b^p)^(1/p); L = alpha + (kappa[pattern] + gamma "
           "* message_MB) * delay; messages = 2(n-1) * buckets * collectives per bucket")
TIMING = ("in-process perf_counter timings of the ranges a profiled run marks (batch, backward, allreduce b{k}), "
          "reduced by handler/profiling/comm.py's comm_stats, per step; medians over the timed steps")


def assumptions(measured_epoch_s, step_s: float, params: dict) -> list:
    epoch = f"MEASURED 1-GPU epoch {measured_epoch_s:g} s" if measured_epoch_s else (
        f"ASSUMED 1-GPU epoch {ASSUMED_GPU_EPOCH_S:g} s (no GPU run in this repository; an estimate from "
        "3.3 GFLOP per image at 15 TFLOP/s)")
    return [f"per-GPU step {step_s * 1e3:.0f} ms = {epoch} / {GPU_STEPS_PER_EPOCH} steps of 256 images",
            "weak scaling: every GPU keeps 256 images per step; one GPU per node; ring all-reduce, "
            "2(n-1)/n of the payload per GPU",
            f"latency per ring message = alpha {params['alpha_s'] * 1e6:.0f} us + the hook's kappa ("
            + ", ".join(f"{h} {v['kappa']:.2f}" for h, v in params["hooks"].items())
            + f") x {PORT_LATENCY_US} us per switch port: alpha and kappa FITTED here (gloo over TCP), the port "
            "latency ASSUMED (a rack's 20 us one way)",
            "overlap window: the share of the step it had in the fitted rows (resnet20 on CPU)",
            "link efficiency beta and wire overhead as fitted on the shaped veth (TCP); compression "
            "compute on the GPU left out (unmeasured)"]


def report(results: dict) -> str:
    rows, env = results["rows"], results["env"]
    lines = [f"{env['model']}, 8 images per rank, buckets {env['bucket_cap_mb']} MB, hosts {env['hosts']} x 1 rank "
             f"x 1 thread, gloo; {TIMING}",
             table(["hosts", "Mbit/s", "delay ms", "hook", "step s", "compute s", "comm s", "exposed s", "MB/step",
                    "img/s"],
                   [(r["hosts"], r["rate_mbit"], r["delay_ms"], r["hook"], r["step_s"], r["compute_s"], r["comm_s"],
                     r["exposed_comm_s"], r["bytes_per_step"] / 1e6, r["images_per_s"]) for r in rows])]
    if env.get("note"):
        lines.append(f"NOTE: {env['note']}")
    model = results["model"]
    fitted = model["fit_all_cells"]
    if fitted:
        lines.append(f"fit on every 2-host cell: beta {fitted['beta']:.3f}, alpha {fitted['alpha_s'] * 1e6:.0f} us "
                     f"per message, gamma {fitted['gamma_per_mb']:.2f} port delays per MB a message carries, p "
                     f"{fitted['power']:g}, kappa (port delays each 2-host message waits, its size included) "
                     + ", ".join(f"{h} {v['kappa']:.2f}" for h, v in fitted["hooks"].items()))
    for c in model["checks"]:
        lines.append(f"fitted without {c['held_out'][0]:g} Mbit/s {c['held_out'][1]:g} ms, predicting it: "
                     + ", ".join(f"{h} {e['predicted_s']:.3f} s vs {e['measured_s']:.3f} s ({100 * e['error']:.0f} %)"
                                 for h, e in c["per_hook"].items()))
    hosts = model["hosts_prediction"]
    if hosts:
        lines.append(f"{hosts['hosts']} hosts from the 2-host fit (this machine's CPU work x{hosts['cpu_share']:.2f} "
                     f"at {hosts['hosts']} ranks against 2, the median over the hooks' compute at {hosts['calibration'][0]:g} Mbit/s "
                     f"{hosts['calibration'][1]:g} ms): "
                     + ", ".join(f"{e['hook']} {e['cell'][0]:g}/{e['cell'][1]:g} {e['predicted_s']:.3f} s vs "
                                 f"{e['measured_s']:.3f} s ({100 * e['error']:.0f} %)" for e in hosts["per_row"]))
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
