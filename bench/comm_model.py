"""bench.comm's step-time model: fitted on measured rows, checked on a held-out rate, then
used to predict DDP's scaling on real clusters.

    step = compute + max(0, comm - window)
    comm = fixed[hook] + beta * wire_bytes * 8 / rate

compute (step minus exposed comm) and window (backward compute between the first and the
last bucket launch: what comm can hide behind) are each hook's medians over the fitted
rows; fixed[hook] (per-step cost at any rate: compression, software, latency) and beta
(link efficiency: 1 means the shaped rate is fully used) are least squares on their comm.
"""
import math

import numpy as np

NODES = (2, 4, 8, 16, 32)
GBITS = (1, 10, 25, 100)


def line_time(wire_bytes: float, rate_mbit: float) -> float:
    return wire_bytes * 8 / (rate_mbit * 1e6)


def fit(rows) -> dict:
    hooks = sorted({r["hook"] for r in rows})
    a = np.array([[float(r["hook"] == h) for h in hooks] + [line_time(r["bytes_per_step"], r["rate_mbit"])]
                  for r in rows])
    solution, *_ = np.linalg.lstsq(a, np.array([r["comm_s"] for r in rows]), rcond=None)
    params = {"beta": float(solution[-1]), "hooks": {}}
    for i, h in enumerate(hooks):
        mine = [r for r in rows if r["hook"] == h]
        params["hooks"][h] = {"fixed_s": float(solution[i]), "compute_s": _median([r["compute_s"] for r in mine]),
                              "window_s": _median([r["window_s"] for r in mine]),
                              "bytes_per_step": _median([r["bytes_per_step"] for r in mine])}
    return params


def predict_step(params: dict, hook: str, rate_mbit: float, wire_bytes: float = None) -> float:
    h = params["hooks"][hook]
    wire = h["bytes_per_step"] if wire_bytes is None else wire_bytes
    comm = h["fixed_s"] + params["beta"] * line_time(wire, rate_mbit)
    return h["compute_s"] + max(0.0, comm - h["window_s"])


def check(rows, held_out: float) -> dict:
    """Fit on every rate but `held_out`, predict it: relative step-time error per hook."""
    params = fit([r for r in rows if r["rate_mbit"] != held_out])
    errors = {}
    for r in rows:
        if r["rate_mbit"] == held_out:
            predicted = predict_step(params, r["hook"], held_out, r["bytes_per_step"])
            errors[r["hook"]] = {"measured_s": r["step_s"], "predicted_s": predicted,
                                 "error": abs(predicted - r["step_s"]) / r["step_s"]}
    return {"held_out_mbit": held_out, "params": params, "per_hook": errors,
            "worst": max(e["error"] for e in errors.values())}


def scaling(params: dict, hooks: dict, gpu_step_s: float, latency_s: float, nodes=NODES, gbits=GBITS) -> dict:
    """Predicted weak-scaling efficiency (each GPU keeps its batch) of ResNet-18 with each hook.

    hooks: name -> {"payload_bytes", "buckets", "collectives_per_bucket"}. A ring all-reduce sends
    2(n-1)/n of the payload per GPU in 2(n-1) latency-bound steps per collective. The overlap
    window keeps the share of the step it has in the fitted rows (allreduce's); compression
    compute (fixed_s on the CPU here) is left out, and said so in the assumptions.
    """
    share = min(1.0, params["hooks"]["allreduce"]["window_s"] / params["hooks"]["allreduce"]["compute_s"])
    window = share * gpu_step_s
    overhead = _wire_overhead(params)
    table = {}
    for hook, h in hooks.items():
        table[hook] = {}
        for n in nodes:
            for g in gbits:
                sent = 2 * (n - 1) / n * h["payload_bytes"] * overhead
                comm = (params["beta"] * line_time(sent, g * 1000)
                        + 2 * (n - 1) * h["buckets"] * h["collectives_per_bucket"] * latency_s)
                table[hook][f"{n}x{g}"] = gpu_step_s / (gpu_step_s + max(0.0, comm - window))
    return {"efficiency": table, "window_share": share, "wire_overhead": overhead, "nodes": list(nodes),
            "gbits": list(gbits)}


def _wire_overhead(params: dict) -> float:
    """Bytes on the link per payload byte (headers, acknowledgements), from allreduce's rows."""
    h = params["hooks"]["allreduce"]
    return h["bytes_per_step"] / h["payload_bytes"] if h.get("payload_bytes") else 1.0


def _median(values):
    values = sorted(values)
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
