"""bench.comm's step-time model: fitted on measured 2-host rows, checked on a held-out
(rate, delay) cell and on more hosts, then used to predict DDP's scaling on real clusters.

    step = compute + max(0, comm - window)
    comm = smax_p(floor[hook] + messages * L, beta * wire_bytes * 8 / rate + messages / buckets * L)
    L = alpha + (kappa[pattern] + gamma * message_MB) * delay
    messages = 2 (n - 1) * buckets * collectives per bucket     smax_p(a, b) = (a^p + b^p)^(1/p)

compute (step minus exposed comm) and window (backward compute between the first and the
last bucket launch: what comm can hide behind) are each hook's medians over the fitted rows.
The exchange is bound by the wire (beta: link efficiency, 1 when the shaped rate is fully
used) or, on a fast link, by the CPU's part of it (copies, compression, contention with
backward: each hook's floor). Where the two bounds are close they partly add: p, chosen
from (2, 4, 8, inf) by the fitted rows' squared error (inf: the plain maximum).

Latency L is what a message waits: alpha with no delay added, plus port delays (every
host's link is delayed alike, so a message host to host crosses two ports: 2 when a message
waits one crossing, 4 when it waits a round trip). How many depends on the hook's message
pattern, one kappa per collectives per bucket (one all-reduce per bucket: allreduce, fp16,
bf16; three in turn: PowerSGD), and on the message's size: gamma port delays per MB a
message carries (a bigger message needs more of TCP's window over the round trip). A
CPU-bound exchange waits every message in turn, a wire-bound one only one bucket's:
meanwhile the next bucket's bytes keep the link busy. beta, alpha and gamma are one for all
hooks; at a fixed host count alpha cannot be told apart from the floors (each hook's
messages are fixed), so the fit keeps it only where the floors leave a need for it
(docs/COMM.md).
"""
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]
Rows = list[dict[str, Any]]  # bench.comm's measured rows
Params = dict[str, Any]  # the fit's parameters, per hook and shared

NODES = (2, 4, 8, 16, 32)
GBITS = (1, 10, 25, 100)
BETAS = np.linspace(0.5, 2.0, 151)
FLOOR_MARGIN = 1.25
ROUNDS = 8  # alternations between the latency's least squares and the floors; they settle in a few
POWERS = (2.0, 4.0, 8.0, math.inf)  # how the CPU's and the wire's bounds combine (inf: the larger one)


def soft_max(a: ArrayLike, b: ArrayLike, power: float) -> Array:
    """(a^p + b^p)^(1/p): the larger bound, plus part of the smaller where they are close."""
    a, b = np.maximum(a, 0.0), np.maximum(b, 0.0)
    top = np.maximum(a, b)
    if math.isinf(power):
        return top
    scale = np.where(top > 0, top, 1.0)  # over the larger, so a huge time cannot overflow its power
    return np.asarray(scale * ((a / scale) ** power + (b / scale) ** power) ** (1 / power), dtype=np.float64)


def line_time(wire_bytes: float, rate_mbit: float) -> float:
    return wire_bytes * 8 / (rate_mbit * 1e6)


def ring_messages(hosts: int, buckets: int, per_bucket: int) -> int:
    """Sequential messages per step: each collective is 2(n-1) ring steps."""
    return 2 * (hosts - 1) * buckets * per_bucket


def ring_share(hosts: int) -> float:
    """Each host sends 2(n-1)/n of the payload in a ring all-reduce (nccl-tests' busbw factor)."""
    return 2 * (hosts - 1) / hosts


def _terms(rows: Rows) -> Array:
    """Per row: wire seconds at beta 1, messages, messages of one bucket, delay (s), MB per message."""
    return np.array([[line_time(r["bytes_per_step"], r["rate_mbit"]), r["messages"], r["messages"] / r["buckets"],
                      (r["delay_ms"] or 0.0) / 1e3, message_mb(r["bytes_per_step"], r["messages"])] for r in rows])


def message_mb(wire_bytes: float, messages: float) -> float:
    return wire_bytes / messages / 1e6 if messages else 0.0


def _solve(terms: Array, target: Array) -> Array:
    """Non-negative least squares by dropping: a negative coefficient is set to 0, the rest refitted."""
    keep: list[int] = list(range(terms.shape[1]))
    coef = np.zeros(terms.shape[1])
    while keep:
        solved = np.asarray(np.linalg.lstsq(terms[:, keep], target, rcond=None)[0], dtype=np.float64)
        if (solved >= 0).all():
            coef[keep] = solved
            return coef
        keep = [k for k, v in zip(keep, solved.tolist()) if v >= 0]
    return coef


def _branches(terms: Array, floor: Array, beta: float, alpha: float, kappa: Array,
              gamma: float) -> tuple[Array, Array, NDArray[np.bool_]]:
    """Both bounds of comm for each row (kappa: each row's pattern's), and which holds (True: the CPU's)."""
    latency = alpha + (kappa + gamma * terms[:, 4]) * terms[:, 3]
    cpu = floor + terms[:, 1] * latency
    wire = beta * terms[:, 0] + terms[:, 2] * latency
    return cpu, wire, cpu >= wire


def _fit_at(rows: Rows, hooks: list[str], patterns: list[int], terms: Array, comm: Array,
            beta: float) -> tuple[float, Array, dict[str, float], tuple[Array, Array]]:
    """For one beta: floors, then alpha, each pattern's kappa and gamma, alternately, until
    they settle; the squared error. A row bound by the CPU waits every message's latency; one
    bound by the wire one bucket's."""
    hook = np.array([str(r["hook"]) for r in rows])
    onehot = np.array([[r["collectives_per_bucket"] == k for k in patterns] for r in rows], float)
    coef = np.zeros(2 + len(patterns))  # alpha, kappa per pattern, gamma
    on_cpu = comm > FLOOR_MARGIN * beta * terms[:, 0]
    floors: dict[str, float] = {h: 0.0 for h in hooks}
    floor = np.zeros(len(rows))
    for _ in range(ROUNDS):
        waits = (onehot @ coef[1:-1] + coef[-1] * terms[:, 4]) * terms[:, 3]
        rest = comm - terms[:, 1] * (coef[0] + waits)
        floors = {h: _mean_where(rest, on_cpu & np.asarray(hook == h, dtype=np.bool_)) for h in hooks}
        floor = np.array([floors[str(h)] for h in hook])
        count = np.where(on_cpu, terms[:, 1], terms[:, 2])  # messages whose latency the row waits
        target = comm - np.where(on_cpu, floor, beta * terms[:, 0])
        delayed = count * terms[:, 3]
        settled, coef = coef, _solve(np.c_[count, delayed[:, None] * onehot, delayed * terms[:, 4]], target)
        now = _branches(terms, floor, beta, coef[0], onehot @ coef[1:-1], coef[-1])[2]
        if np.allclose(settled, coef, rtol=1e-6, atol=1e-9) and (now == on_cpu).all():
            break
        on_cpu = now
    cpu, wire, _ = _branches(terms, floor, beta, coef[0], onehot @ coef[1:-1], coef[-1])
    return float(np.sum((np.maximum(cpu, wire) - comm) ** 2)), coef, floors, (cpu, wire)


def _mean_where(values: Array, mask: NDArray[np.bool_]) -> float:
    return float(np.mean(values[mask])) if mask.any() else 0.0


def fit(rows: Rows) -> Params:
    hooks = sorted({r["hook"] for r in rows})
    patterns = sorted({r["collectives_per_bucket"] for r in rows})
    params: dict[str, Any] = {"hooks": {h: _hook_medians([r for r in rows if r["hook"] == h]) for h in hooks}}
    terms, comm = _terms(rows), np.array([r["comm_s"] for r in rows])
    best = min((_fit_at(rows, hooks, patterns, terms, comm, float(beta)) + (float(beta),) for beta in BETAS),
               key=lambda found: found[0])
    _, coef, floors, (cpu, wire), beta = best
    power = min(POWERS, key=lambda p: float(np.sum((soft_max(cpu, wire, p) - comm) ** 2)))
    params.update(beta=beta, alpha_s=float(coef[0]), gamma_per_mb=float(coef[-1]), power=power)
    for h, mine in params["hooks"].items():
        base = float(coef[1 + patterns.index(mine["collectives_per_bucket"])])
        # kappa: the port delays one of this hook's 2-host messages waits, its size included
        at_two = message_mb(mine["bytes_per_step"], ring_messages(2, mine["buckets"], mine["collectives_per_bucket"]))
        mine.update(floor_s=floors[h], kappa_base=base, kappa=base + params["gamma_per_mb"] * at_two)
    return params


def _hook_medians(mine: Rows) -> Params:
    return {"compute_s": _median([r["compute_s"] for r in mine]), "window_s": _median([r["window_s"] for r in mine]),
            "bytes_per_step": _median([r["bytes_per_step"] for r in mine]),
            "message_overhead_bytes": _median([message_overhead(r) for r in mine]),
            "buckets": _median([r["buckets"] for r in mine]),
            "collectives_per_bucket": mine[0]["collectives_per_bucket"]}


def message_overhead(row: Params) -> float:
    """Bytes a message puts on the wire beside its share of the payload (packet and gloo
    headers, the peer's acknowledgements): what the interface counted over the ring's
    2(n-1)/n of the gradients, per message. About 0.8 kB here at any host count; it is most of
    PowerSGD's few bytes (docs/COMM.md)."""
    if not row["messages"]:
        return 0.0
    return (row["bytes_per_step"] - row["payload_bytes_per_step"] * ring_share(row["hosts"])) / row["messages"]


def predict_comm(params: Params, hook: str, floor: float, wire_bytes: float, rate_mbit: float, messages: float,
                 delay_ms: float, buckets: float) -> float:
    """The CPU's bound waits every message's latency; the wire's only one bucket's (while a
    message waits, the next bucket's bytes keep the link busy)."""
    waits = params["hooks"][hook]["kappa_base"] + params["gamma_per_mb"] * message_mb(wire_bytes, messages)
    latency = params["alpha_s"] + waits * delay_ms / 1e3
    return exchange_s(floor, params["beta"] * line_time(wire_bytes, rate_mbit), messages, buckets, latency,
                      params["power"])


def exchange_s(floor: float, wire_s: float, messages: float, buckets: float, latency_s: float, power: float) -> float:
    """One step's all-reduce: the CPU's bound (its floor, then every message's latency in turn)
    or the wire's (its bytes at the link's rate, then one bucket's messages' latency), partly
    added where they are close. The one formula of comm; handler/profiling/whatif.py uses it too."""
    return float(soft_max(floor + messages * latency_s, wire_s + messages / buckets * latency_s, power))


def step_s(compute: float, comm: float, window: float) -> float:
    """A step: its compute, plus the all-reduce that backward's window cannot hide."""
    return compute + max(0.0, comm - window)


def predict_step(params: Params, hook: str, row: Params) -> float:
    """A row's step from the fit: its hook's compute, window and floor; the row's own link."""
    h = params["hooks"][hook]
    comm = predict_comm(params, hook, h["floor_s"], row.get("bytes_per_step", h["bytes_per_step"]), row["rate_mbit"],
                        row["messages"], row["delay_ms"] or 0.0, row.get("buckets", h["buckets"]))
    return step_s(h["compute_s"], comm, h["window_s"])


def _error(predicted: float, measured: float) -> dict[str, float]:
    return {"measured_s": measured, "predicted_s": predicted, "error": abs(predicted - measured) / measured}


def check(rows: Rows, held_out: tuple[float, float]) -> Params:
    """Fit on every (rate, delay) cell but `held_out`, predict it: relative step-time error per hook."""
    params = fit([r for r in rows if cell(r) != held_out])
    errors = {r["hook"]: _error(predict_step(params, r["hook"], r), r["step_s"]) for r in rows if cell(r) == held_out}
    return {"held_out": list(held_out), "params": params, "per_hook": errors,
            "worst": max(e["error"] for e in errors.values())}


def predict_hosts(params: Params, rows: Rows, calibration: tuple[float, float]) -> Params:
    """More hosts from the 2-host fit. The ring: each host sends 2(n-1)/n of the payload in
    2(n-1) messages per collective, each message with the overhead the 2-host rows show;
    beta, alpha and kappa are the fit's. Two terms need one measured cell of the new host count (the fast,
    undelayed `calibration`):
    - compute and the overlap window: n ranks share this machine's 2 cores (a real cluster's
      GPUs would not). Every hook runs the same forward and backward, so one factor serves
      them all: the median over the hooks of the cell's compute over the 2-host fit's. One
      hook's few steps would carry their 10-20 % noise into all its predictions.
    - the CPU floor, each hook's own: at 2 hosts its per-message software cost cannot be told
      apart from the rest of the floor (each hook's messages are fixed), and it grows with
      the ring's 2(n-1) steps by a different share for each hook (docs/COMM.md).
    Every other cell is predicted."""
    hosts = rows[0]["hosts"]
    base = {r["hook"]: r for r in rows if cell(r) == calibration}
    share = _median([b["compute_s"] / params["hooks"][hook]["compute_s"] for hook, b in base.items()])
    per_row: Rows = []
    for r in rows:
        if cell(r) == calibration or r["hook"] not in base:
            continue
        h, b = params["hooks"][r["hook"]], base[r["hook"]]
        messages = ring_messages(hosts, h["buckets"], h["collectives_per_bucket"])
        wire = r["payload_bytes_per_step"] * ring_share(hosts) + messages * h["message_overhead_bytes"]
        floor = b["comm_s"] - messages * params["alpha_s"]  # the calibration cell's comm, less its latency
        comm = predict_comm(params, r["hook"], floor, wire, r["rate_mbit"], messages, r["delay_ms"] or 0.0, h["buckets"])
        predicted = step_s(share * h["compute_s"], comm, share * h["window_s"])
        per_row.append({"hook": r["hook"], "cell": list(cell(r)), "wire_bytes_predicted": wire,
                        "wire_bytes_measured": r["bytes_per_step"], **_error(predicted, r["step_s"])})
    return {"hosts": hosts, "calibration": list(calibration), "cpu_share": share, "per_row": per_row,
            "worst": max((e["error"] for e in per_row), default=None)}


def cell(row: Params) -> tuple[float, float]:
    return (row["rate_mbit"], row["delay_requested_ms"])


def scaling(params: Params, hooks: dict[str, Params], gpu_step_s: float, port_latency_s: float,
            nodes: tuple[int, ...] = NODES, gbits: tuple[int, ...] = GBITS) -> Params:
    """Predicted weak-scaling efficiency (each GPU keeps its batch) of a model with each hook.

    hooks: name -> {"payload_bytes", "buckets", "collectives_per_bucket"}. A ring all-reduce sends
    2(n-1)/n of the payload per GPU in 2(n-1) latency-bound steps per collective; as in the fit,
    a wire-bound exchange waits one bucket's latency, a latency-bound one every message's. Each
    message's latency: the fitted alpha plus the hook's fitted kappa (the port delays one of its
    lab-size messages waits; gamma's size term is not stretched to other buckets) times
    `port_latency_s`. The overlap
    window keeps the share of the step it has in the fitted rows (allreduce's); the CPU floors
    are left out (a GPU's copies and compression are not this CPU's), and said so.
    """
    plain = params["hooks"]["allreduce"]
    share = min(1.0, plain["window_s"] / plain["compute_s"])
    window = share * gpu_step_s
    overhead = plain["bytes_per_step"] / plain["payload_bytes"] if plain.get("payload_bytes") else 1.0
    table = {}
    latency = {hook: params["alpha_s"] + params["hooks"][hook]["kappa"] * port_latency_s for hook in hooks}
    for hook, h in hooks.items():
        table[hook] = {}
        latency_s = latency[hook]
        for n in nodes:
            for g in gbits:
                sent = ring_share(n) * h["payload_bytes"] * overhead
                messages = ring_messages(n, h["buckets"], h["collectives_per_bucket"])
                comm = exchange_s(0.0, params["beta"] * line_time(sent, g * 1000), messages, h["buckets"],  # no CPU
                                  latency_s, params["power"])  # floor: a GPU's copies are not this CPU's
                table[hook][f"{n}x{g}"] = gpu_step_s / step_s(gpu_step_s, comm, window)
    return {"efficiency": table, "window_share": share, "wire_overhead": overhead, "latency_s": latency,
            "nodes": list(nodes), "gbits": list(gbits)}


def _median(values: Iterable[float]) -> float:
    values = sorted(values)
    if not values:
        return math.nan
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
