"""bench.comm's step-time model: fitted on measured rows, checked on a held-out rate, then
used to predict DDP's scaling on real clusters.

    step = compute + max(0, comm - window)
    comm = max(floor[hook], beta * wire_bytes * 8 / rate + messages * latency)

compute (step minus exposed comm) and window (backward compute between the first and the
last bucket launch: what comm can hide behind) are each hook's medians over the fitted
rows. comm is bandwidth-bound (beta: link efficiency, 1 when the shaped rate is fully
used) or, on a fast link, bound below by a floor: the CPU's part of the exchange (copies,
compression) and its contention with backward. The floor is the mean comm of the rows
the wire cannot explain; beta (one for all hooks) is least squares on the rows' comm.
"""
import math
from typing import Any, Dict, Optional

import numpy as np

NODES = (2, 4, 8, 16, 32)
GBITS = (1, 10, 25, 100)
BETAS = np.linspace(0.5, 2.0, 1501)
FLOOR_MARGIN = 1.25


def line_time(wire_bytes: float, rate_mbit: float) -> float:
    return wire_bytes * 8 / (rate_mbit * 1e6)


def fit(rows) -> dict:
    hooks = sorted({r["hook"] for r in rows})
    params: Dict[str, Any] = {"hooks": {h: {"compute_s": _median([r["compute_s"] for r in rows if r["hook"] == h]),
                            "window_s": _median([r["window_s"] for r in rows if r["hook"] == h]),
                            "bytes_per_step": _median([r["bytes_per_step"] for r in rows if r["hook"] == h])}
                        for h in hooks}}
    best = (math.inf, None, None)
    for beta in BETAS:  # for each beta, each hook's best floor; keep the beta with the least error
        total, floors = 0.0, {}
        for h in hooks:
            comm = np.array([r["comm_s"] for r in rows if r["hook"] == h])
            line = beta * np.array([line_time(r["bytes_per_step"], r["rate_mbit"]) for r in rows if r["hook"] == h])
            floors[h], err = _best_floor(comm, line)
            total += err
        if total < best[0]:
            best = (total, float(beta), floors)
    assert best[2] is not None, "some beta gives a finite error"
    params["beta"] = best[1]
    for h in hooks:
        params["hooks"][h]["floor_s"] = best[2][h]
    return params


def _best_floor(comm, line) -> tuple:
    """The floor: the mean comm of the rows the wire cannot explain (comm above FLOOR_MARGIN
    times their line time); none when every row is bandwidth-bound. Returns (floor, squared error)."""
    bound = comm > FLOOR_MARGIN * line
    floor = float(np.mean(comm[bound])) if bound.any() else 0.0
    return floor, float(np.sum((np.maximum(floor, line) - comm) ** 2))


def predict_step(params: dict, hook: str, rate_mbit: float, wire_bytes: Optional[float] = None, latency_s: float = 0.0,
                 messages: int = 0) -> float:
    h = params["hooks"][hook]
    wire = h["bytes_per_step"] if wire_bytes is None else wire_bytes
    comm = max(h["floor_s"], params["beta"] * line_time(wire, rate_mbit) + messages * latency_s)
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
    """Predicted weak-scaling efficiency (each GPU keeps its batch) of a model with each hook.

    hooks: name -> {"payload_bytes", "buckets", "collectives_per_bucket"}. A ring all-reduce sends
    2(n-1)/n of the payload per GPU in 2(n-1) latency-bound steps per collective. The overlap
    window keeps the share of the step it has in the fitted rows (allreduce's); the CPU floors
    are left out (a GPU's copies and compression are not this CPU's), and said so.
    """
    plain = params["hooks"]["allreduce"]
    share = min(1.0, plain["window_s"] / plain["compute_s"])
    window = share * gpu_step_s
    overhead = plain["bytes_per_step"] / plain["payload_bytes"] if plain.get("payload_bytes") else 1.0
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


def _median(values):
    values = sorted(values)
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
