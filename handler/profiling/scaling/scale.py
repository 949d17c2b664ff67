"""Each part of a split step (step.py) scaled to n GPUs (or CPU processes), per mode.

- the wait for data: the loaders' cores. Each process's loader uses its workers' cores (1, the
  rank's own thread, without workers), beside a core for each rank's main thread, up to the
  host's cores (cores.py): past them the wait stops shrinking. dp (one process) keeps it; on a
  CPU run the loaders and the ranks share the same cores, so it stays.
- the host's work stays; the GPU's busy time splits over the GPUs; on a CPU run the cores are
  shared by the ranks' compute and the loaders, from the run's own CPU time (cores.py); a run
  that recorded none takes what other reports of this machine measured at n (`cpu_factors`),
  else holds it, and says so.
- communication rides the link: ddp's ring all-reduce (comm_model.exchange_s) of what its comm
  hook sends, hidden behind backward where it can be; dp's broadcast of the parameters and
  gather of the gradients, one GPU to each other in turn; pp none: its stages pass activations
  (not modelled), and its pipeline span follows the bubble, (M + W - 1) micro-batch slots of 1/W
  of the work each (bubble.py), never less than the work spread over the stages.
At the report's own count every term is the measured one, so the step is the measured step.
"""
from dataclasses import dataclass
from typing import Any

from .cores import cpu_work, gpu_loader_cores
from .comm_model import exchange_s, line_time, ring_messages, ring_share, step_s
from ..record.summary import Machine
from .links import BETA, Link, Payload
from .step import Split, bound_of, step_of

Cell = dict[str, Any]  # a predicted count: count, processes, step_ms, epoch_s, keeps_up_epoch_s, terms_ms, comm_ms, bound
POWER = 4.0  # how the CPU's and the wire's bounds add: every quiet bench.comm fit chose 4 (docs/COMM.md)


@dataclass(frozen=True)
class Setting:
    """What a prediction needs beside the split: the mode's shape, the link, what a step sends,
    the machine block and, on a CPU run, the compute factor measured at each count."""
    mode: str  # "dp" (one process), "pp" (stages) or "ddp" (a rank per GPU: ddp, ddp_dali, fsdp)
    link: Link
    sent: Payload
    machine: Machine
    cpu_factors: dict[int, float]
    between: Link | None = None  # the link between nodes, where a ring can span them (facts.Nodes)
    per_node: int = 0  # devices a node holds; 0: every count on one node


def link_at(n: int, s: Setting) -> Link:
    """The link a ring of n devices rides: past one node's devices, the slower of the node's and the
    one between nodes (every ring step waits for its slowest hop)."""
    if s.between is None or not s.per_node or n <= s.per_node:
        return s.link
    return min(s.link, s.between, key=lambda k: k.gbit)


def loader_cores(processes: int, machine: Machine) -> float:
    """The cores a GPU run's loaders get beside the ranks' main threads (cores.py)."""
    return gpu_loader_cores(processes, machine)


def cpu_compute(split: Split, n: int, s: Setting) -> float:
    """A CPU run's cores term at n ranks: from its own CPU time where the run recorded it (cores.py),
    its compute times the threads' efficiency other reports of the machine measured at n
    (`cpu_factors` holds cores.efficiency then); else the factor other reports measured at n
    (`cpu_factors`), else held; whatif.facts says which."""
    if n == split.processes or s.mode == "dp":
        return split.busy
    shared = cpu_work(split, n, s.machine, s.cpu_factors.get(n, 1.0))  # factors: cores.efficiency here
    return shared if shared is not None else split.busy * s.cpu_factors.get(n, 1.0)


def comm_at(split: Split, n: int, s: Setting) -> float:
    """All-reduce seconds per step at n processes; at the report's own count, its own."""
    if n == split.processes and split.comm is not None:
        return split.comm
    floor = split.comm if (split.comm is not None and split.processes == 1) else 0.0
    if n < 2:
        return floor
    link = link_at(n, s)
    wire = BETA * line_time(ring_share(n) * s.sent.mb * 1e6, link.gbit * 1e3) if link.gbit != float("inf") else 0.0
    return exchange_s(floor, wire, ring_messages(n, s.sent.buckets, s.sent.per_bucket), s.sent.buckets,
                      link.latency_us / 1e6, POWER)


def dp_exchange(gpus: int, s: Setting) -> float:
    """dp's parameters out to each other GPU and their gradients back, in turn over the link."""
    if s.link.gbit == float("inf") or gpus < 2:
        return 0.0
    return line_time(2 * (gpus - 1) * s.sent.mb * 1e6, s.link.gbit * 1e3)


PP_MICROBATCHES = 4  # the harness's --microbatches default (handler/PP/options.py): where a report reads none


def pipeline_ratio(split: Split, n: int) -> float:
    """pp's pipeline span at n stages over the report's: (M + W - 1) / W slots of the whole work."""
    pipe = split.pipeline
    m = (pipe.microbatches if pipe else None) or PP_MICROBATCHES
    w0 = pipe.stages if pipe else split.processes
    return ((m + n - 1) / n) / ((m + w0 - 1) / w0)


def dp_terms(split: Split, n: int, s: Setting, work: dict[str, float]) -> tuple[dict[str, float], float, float]:
    """dp at n GPUs: (work, link, exchange). The GPUs' compute is the report's spread over n (never less
    per GPU at fewer GPUs); the exchange grows or shrinks by the model's difference: more GPUs add it
    on the link; fewer take it off what the report booked to the link, then off the host's work, which
    waited for it; never off compute, and at 1 GPU there is none."""
    own = split.devices
    exchange = dp_exchange(n, s)
    change = exchange - dp_exchange(own, s)
    saved = max(0.0, -change)
    off_link = min(split.exposed, saved)
    link = split.exposed - off_link + max(0.0, change)  # at 1 GPU only what the report booked past its exchange
    return {**work, "host": max(0.0, work["host"] - (saved - off_link))}, link, exchange


def predict(split: Split, n: int, s: Setting) -> Cell:
    """The epoch at n GPUs (or CPU processes): the step's terms, the epoch, the epoch with a
    loader that keeps up, and the bound (step.bound_of)."""
    own = split.devices if split.gpu else split.processes
    processes = 1 if s.mode == "dp" else n
    if split.gpu:
        wait = split.wait * loader_cores(split.processes, s.machine) / loader_cores(processes, s.machine)
        work = {"host": split.host, "device": split.busy * own / n}
    else:
        wait = split.wait  # dp on a CPU is one process at any count: nothing of it changes
        work = {"cores": cpu_compute(split, n, s)}
    link = split.exposed
    if s.mode == "pp":  # its first stage loads every batch; the stages' work follows the bubble
        wait, ratio = split.wait, max(pipeline_ratio(split, n), own / n)  # the work alone, spread over n stages
        work = {"host": split.host * ratio, "device": split.busy * ratio} if split.gpu else {"cores": split.busy * ratio}
        comm = 0.0
    elif s.mode == "dp" and not split.gpu:
        comm = 0.0
    elif s.mode == "dp":
        work, link, comm = dp_terms(split, n, s, work) if n != own else (work, link, dp_exchange(n, s))
    else:
        comm = comm_at(split, processes, s)
        scale = (work.get("device", work.get("cores", 0.0)) / split.busy) if split.busy else 1.0
        window = ((split.comm - split.exposed) if split.comm is not None
                  else split.compute_share * split.busy) * scale
        link = split.exposed if n == own else step_s(0.0, comm, window)
    terms = {"loader": wait, "link": link, **work}
    step, keeps_up = step_of(terms, split.gpu)
    return {"count": n, "processes": processes, "step_ms": step * 1e3, "epoch_s": step * split.steps_per_epoch,
            "keeps_up_epoch_s": keeps_up * split.steps_per_epoch, "terms_ms": {k: v * 1e3 for k, v in terms.items()},
            "comm_ms": comm * 1e3, "bound": bound_of(terms)}


def cpu_factors(others: dict[str, dict[int, Split]], own: int) -> dict[int, float]:
    """count -> the compute per step there over the compute at `own`, measured by other modes' reports
    of the same machine (mode -> count -> split; each at both counts), the median over them."""
    out: dict[int, float] = {}
    for n in sorted({c for by in others.values() for c in by} - {own}):
        ratios = sorted(by[n].busy / by[own].busy for by in others.values() if n in by and own in by and by[own].busy)
        if ratios:
            mid = len(ratios) // 2
            out[n] = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return out
