"""Per-rank numbers from the NVTX ranges of docs/PROFILING.md (and CUDA activity on GPU runs).

A phase counts only inside a `batch` range, so evaluation's forward passes, say, never
inflate training shares. Shares are of summed batch time; what no phase covers is "other".
A phase's time is its own: the loop's `data` holds the loader's `h2d`, which counts as `h2d`
only. Every name comes from handler/runtime/names.py, as the training side's do.
"""
from collections.abc import Sequence
from typing import Any
import bisect
from dataclasses import asdict

from handler.runtime.names import BATCH, DATA, DATA_GPU, EPOCH, OUTSIDE_TRAINING, PHASES

from .bubble import pipeline_stats
from .devices import gpu_table
from .scaling.epochs import contract, of_written
from .comm import comm_stats, first_comm_starts, stragglers
from .conventions import library_of, unmatched_phases
from .gpu_metrics import device_map
from .gpu_metrics.summary import rank_metrics, rank_pcie_overlap, rank_phase_metrics, unplaced
from .gpu_view import gpu_stats, pipeline_threads
from .scaling.run_facts import run_block
from .stats import intersect, length, merge, nesting_parents, percentile as _percentile, subtract
from .trace import Process, Range, Trace

GPU_PHASES = (*PHASES, DATA_GPU)
NCCL_RANGE = "nccl"  # NCCL's own NVTX ranges: ncclAllReduce, ncclBroadcast, ncclReduce, ...  # the GPU view adds the input pipeline's own GPU work


def host_named(mark: str | None, hostname: str | None, env_host: str | None) -> tuple[str | None, str]:
    """(a rank's host, the source that named it), in this order: its `host NAME` mark, the export's
    TARGET_INFO_SYSTEM_ENV `Hostname` (nsys records the host it ran on), the metrics' env.hosts."""
    for host, source in ((mark, "host mark"), (hostname, "export Hostname"), (env_host, "metrics env.hosts")):
        if host:
            return host, source
    return None, "not recorded: no host mark, Hostname or metrics env.hosts"


def summarize(trace: Trace, metrics: dict[str, Any] | None = None, report: Any = None) -> dict[str, Any]:
    """report: the report's path, the run block's last source for the mode (scaling/run_facts.py)."""
    ranks = [_rank(p, trace) for p in trace.processes]
    env_hosts = ((metrics or {}).get("env") or {}).get("hosts") or {}
    for rank in ranks:  # its host mark, else the export's Hostname, else the metrics JSON's env.hosts
        rank["host"], rank["host_from"] = host_named(rank["host"], trace.hostname, env_hosts.get(str(rank["rank"])))
    for rank, stage in zip(ranks, pipeline_stats(trace.processes, trace.gpu)):  # pp runs only; else None
        rank["pipeline"] = stage
    summary = {"schema": 1, "rank_source": trace.rank_source, "gpu_trace": trace.gpu is not None,
               "ranks": ranks, "overall": _overall(ranks)}
    summary["gpu_metrics_mapping"] = _mapping(trace, ranks) if trace.metrics else None
    summary["gpu_metrics_unplaced"] = unplaced(trace)
    summary["gpu_metrics_unread"] = trace.metrics_unread
    summary["stragglers"] = stragglers(first_comm_per_process(trace))
    summary["metrics_comparison"] = _compare(ranks[0], metrics) if metrics else None
    summary["comm_config"] = comm_config(metrics)
    summary["model"] = ((metrics or {}).get("config") or {}).get("model")  # its gradients' size (whatif.GRAD_MB)
    summary["convention"] = trace.convention
    summary["phases_unmatched"] = unmatched_phases(trace.convention, ranks)  # one line on the page, or None
    summary["gpus"] = gpu_table(trace)
    summary["incomplete"] = incomplete(ranks)
    summary["run"] = run_block(summary, metrics, report)
    summary["measured_epoch"] = contract(of_written(summary))  # the one epoch time every page uses (epochs.py)
    return summary


def incomplete(ranks: list[dict]) -> dict | None:
    """Where a run cut short ended (trace.py, _cut_short), from the ranks' own records: the first
    epoch left open, the ranks it was open on, the complete epochs every rank kept (they still
    count), the steps left out and one line saying so. None for a run that closed every range."""
    cut = [r for r in ranks if r.get("incomplete")]
    if not cut:
        return None
    first = min((r["incomplete"] for r in cut), key=lambda c: c["epoch"])
    kept = min(len(r["epochs"]) for r in ranks)
    dropped = sum(r["incomplete"]["dropped_steps"] for r in cut)
    counted = (f"{kept} complete epoch{'s' if kept != 1 else ''} before it still count{'s' if kept == 1 else ''}"
               if kept else "no epoch completed, so there is no epoch to time")
    return {"epoch": first["epoch"], "range": first["range"], "ranks": [r["rank"] for r in cut],
            "complete_epochs": kept, "dropped_steps": dropped,
            "line": f"the run ended inside {EPOCH(first['epoch'])} (rank{'s' if len(cut) > 1 else ''} "
                    f"{', '.join(str(r['rank']) for r in cut)}; the range never closed): {counted}; the {dropped} "
                    f"step{'s' if dropped != 1 else ''} inside it {'are' if dropped != 1 else 'is'} left out"}


def comm_config(metrics: dict | None) -> dict | None:
    """The run's gradient hook and DDP buckets (docs/COMM.md), from the metrics config.
    None without metrics; an option a run's metrics lack (a run from before it existed) ran
    at its default, read from the mode's own section (handler/modes.py)."""
    config = (metrics or {}).get("config")
    if not config:
        return None
    from ..modes import option_defaults, option_owners
    if config.get("mode") not in option_owners("comm_hook"):
        return None
    c = {**option_defaults(), **config}
    return {"hook": c["comm_hook"], "bucket_cap_mb": c["bucket_cap_mb"],
            "powersgd_rank": c["powersgd_rank"] if c["comm_hook"] == "powersgd" else None,
            "static_graph": c["static_graph"], "grad_as_bucket_view": c["grad_as_bucket_view"]}


def _rank(process: Process, trace: Trace) -> dict:
    gpu, metrics = trace.gpu, trace.metrics
    epochs = sorted((int(m.group(1)), r) for r in process.ranges if (m := EPOCH.match(r.name)))
    batches = sorted((r for r in process.ranges if BATCH.match(r.name)), key=lambda r: r.start)
    batch_total = sum(b.seconds for b in batches)
    phase_ranges = _phase_ranges(process.ranges, batches)
    own = _own_seconds(phase_ranges)
    phase_time = {name: (len(rs), own[name]) for name, rs in phase_ranges.items()}
    activity = gpu.of_pid(process.pid) if gpu is not None else None
    gpu_view = gpu_stats(activity, [r for rs in phase_ranges.values() for r in rs], PHASES,
                         [r for _, r in epochs], batches[0].tid if batches else None, batches,
                         pipeline_threads(process, trace.thread_names)) if activity is not None else None
    gpus = device_map(process.pid, gpu_view["devices"] if gpu_view else (), trace.cuda_devices)
    return {
        "rank": process.rank, "pid": process.pid, "host": process.host,
        "epochs": [{"epoch": e, "time_s": r.seconds} for e, r in epochs],
        "batches": _batch_stats([b.seconds for b in batches]),
        "phases": {name: {"count": phase_time[name][0], "total_s": phase_time[name][1],
                          "share": _ratio(phase_time[name][1], batch_total)} for name in PHASES},
        "other_share": _ratio(batch_total - sum(t for _, t in phase_time.values()), batch_total),
        "outside_training": {name: _totals([r for r in process.ranges if r.name == name])
                             for name in OUTSIDE_TRAINING},
        "gpu": gpu_view,
        "comm": comm_stats(process.ranges, batches, activity),
        "gpu_metrics": rank_metrics(trace, process), "gpu_metrics_phases": rank_phase_metrics(trace, process),
        "pcie_overlap": rank_pcie_overlap(trace, process),
        "gpu_metrics_gpus": {str(cuda): gpu for cuda, gpu in gpus.items()} if metrics else None,
        **setup_ranges(process.ranges, [r for _, r in epochs]),
        "loop": loop_stats([r for _, r in epochs], batches, phase_ranges, [r for r in process.ranges if r.name == DATA]),
        "nccl_ranges": _named_totals(r for r in process.ranges if r.name.startswith(NCCL_RANGE)),
        "incomplete": asdict(process.cut_short) if process.cut_short else None,
    }


def setup_ranges(ranges, epochs: list[Range]) -> dict:
    """The outermost ranges that end before the first epoch starts, split in two:
    `setup`, the loop's own (the kit's "Set data loader", say) by name in order of first
    appearance, with their count and seconds; `setup_libraries`, the libraries' own (DALI's
    executor, NCCL's calls; conventions.library_of) by library, with their count and seconds."""
    if not epochs:
        return {"setup": [], "setup_libraries": []}
    first = min(e.start for e in epochs)
    before = sorted((r for r in ranges if r.end <= first), key=lambda r: (r.tid, r.start, -r.end))
    outer, reach = [], {}
    for r in before:
        if r.start >= reach.get(r.tid, -1):
            outer.append(r)
            reach[r.tid] = r.end
    outer.sort(key=lambda r: r.start)
    libraries: dict[tuple[str, str], dict] = {}
    own = []
    for r in outer:
        library = library_of(r.name, r.domain)
        if library is None:
            own.append(r)
            continue
        entry = libraries.setdefault(library, {"count": 0, "total_s": 0.0})
        entry["count"] += 1
        entry["total_s"] += r.seconds
    return {"setup": [{"name": name, **totals} for name, totals in _named_totals(own).items()],
            "setup_libraries": [{"library": library, "by": by, **totals}
                                for (library, by), totals in libraries.items()]}


def loop_stats(epochs: list[Range], batches: list[Range], phase_ranges: dict, data_ranges: Sequence[Range] = ()) -> dict:
    """Per rank, what the lab computes by hand, over the complete epochs (a run stopped inside an
    epoch never closes its range; the steps it began there are left out): epoch time over steps,
    the time inside the step ranges and between them (a loop that does not mark its data fetch
    waits for data there; one that marks it between its steps, as PyTorch's MNIST example's `Data
    loading`, has data_ranges there: their union outside the steps), and ms per step of each phase."""
    epoch_s = sum(e.seconds for e in epochs)
    bounds = sorted((e.start, e.end) for e in epochs)
    starts = [b[0] for b in bounds]

    def closed(r: Range) -> bool:
        i = bisect.bisect_right(starts, r.start) - 1
        return i >= 0 and r.end <= bounds[i][1]
    kept = [b for b in batches if closed(b)]
    steps, inside = len(kept), sum(b.seconds for b in kept)
    own = _own_seconds({name: [r for r in rs if closed(r)] for name, rs in phase_ranges.items()})
    per_step = (lambda s: s * 1e3 / steps) if steps else (lambda s: None)
    return {"epochs_s": epoch_s, "epochs": len(epochs), "steps": steps,
            "steps_per_epoch": steps / len(epochs) if epochs else None, "step_mean_ms": per_step(epoch_s),
            "inside_steps_ms": per_step(inside), "between_steps_ms": per_step(epoch_s - inside) if epochs else None,
            "between_steps_data_ms": per_step(length(subtract(intersect(merge((r.start, r.end) for r in data_ranges),
                                                                        merge(bounds)),
                                                              merge((b.start, b.end) for b in kept))) / 1e9)
            if epochs else None,
            "phase_ms": {name: per_step(seconds) for name, seconds in own.items()}}


def _named_totals(ranges) -> dict:
    out: dict[str, dict] = {}
    for r in ranges:
        entry = out.setdefault(r.name, {"count": 0, "total_s": 0.0})
        entry["count"] += 1
        entry["total_s"] += r.seconds
    return out


def first_comm_per_process(trace: Trace) -> dict:
    """rank -> {(epoch, batch name): start of its first all-reduce}, on the trace's own clock."""
    return {p.rank: _first_comm(p, trace.gpu) for p in trace.processes}


def _mapping(trace: Trace, ranks: list[dict]) -> str:
    """How GPU metrics (keyed by nsys' GPU id) were matched to a rank's CUDA devices."""
    if trace.cuda_devices is not None:
        missing = [f"rank {r['rank']} CUDA device {cuda}" for r in ranks
                   for cuda, gpu in r["gpu_metrics_gpus"].items() if gpu is None]
        return "TARGET_INFO_CUDA_DEVICE" + (f"; it lists no GPU for {', '.join(missing)}, whose metrics are "
                                            "left out" if missing else "")
    return ("assumed: this export has no TARGET_INFO_CUDA_DEVICE (older nsys, e.g. 2022.2), so a rank's CUDA "
            "device n is taken to be GPU n; wrong where CUDA_VISIBLE_DEVICES hid or reordered GPUs")


def _phase_ranges(ranges: tuple[Range, ...], batches: list[Range]) -> dict:
    """name -> the phase ranges that lie inside some batch."""
    starts = [b.start for b in batches]
    found = {name: [] for name in PHASES}
    for r in ranges:
        if r.name in found:
            i = bisect.bisect_right(starts, r.start) - 1
            if i >= 0 and r.end <= batches[i].end:
                found[r.name].append(r)
    return found


def _own_seconds(found: dict) -> dict:
    """name -> seconds in its ranges less the phase ranges nested in them (on the same thread).
    Without nesting (reports from before the loader's copy nested in `data`) the sums are the
    plain ones, to the last bit."""
    own: dict[str, float] = {name: sum(r.seconds for r in rs) for name, rs in found.items()}
    by_thread: dict[int, list[Range]] = {}
    for r in sorted((r for rs in found.values() for r in rs), key=lambda r: (r.start, -r.end)):
        by_thread.setdefault(r.tid, []).append(r)
    for ranges in by_thread.values():
        for r, parent in zip(ranges, nesting_parents(ranges)):
            if parent >= 0:
                own[ranges[parent].name] -= r.seconds
    return own


def _first_comm(process: Process, gpu) -> dict:
    """Steps are named by (epoch number, batch name), so ranks are compared batch by batch."""
    epochs = sorted((r for r in process.ranges if EPOCH.match(r.name)), key=lambda r: r.start)
    starts = [e.start for e in epochs]
    keyed = []
    for b in process.ranges:
        if BATCH.match(b.name):
            i = bisect.bisect_right(starts, b.start) - 1
            if i >= 0 and b.end <= epochs[i].end:
                epoch = EPOCH.match(epochs[i].name)
                assert epoch, "epochs holds only epoch ranges"
                keyed.append(((epoch.group(1), b.name), b))
    activity = gpu.of_pid(process.pid) if gpu is not None else None
    return first_comm_starts(process.ranges, keyed, activity)


def _totals(ranges: list[Range]) -> dict:
    return {"count": len(ranges), "total_s": sum(r.seconds for r in ranges)}


def _batch_stats(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    stats = {"count": len(ms), "total_s": sum(seconds), "mean_ms": sum(ms) / len(ms) if ms else None}
    stats.update({f"p{q}_ms": _percentile(ms, q) for q in (50, 95, 99)})
    return stats


def _overall(ranks: list[dict]) -> dict:
    """All ranks pooled, for the one-line summary; epoch time is the first rank's mean and
    GPU idle the mean over ranks (each rank has its own GPUs and span)."""
    batch_total = sum(r["batches"]["total_s"] for r in ranks)
    first = ranks[0]["epochs"]
    gpus = [r["gpu"] for r in ranks if r["gpu"]]
    return {
        "ranks": len(ranks),
        "phase_shares": {name: _ratio(sum(r["phases"][name]["total_s"] for r in ranks), batch_total)
                         for name in PHASES},
        "epoch_mean_s": _mean([e["time_s"] for e in first]),
        "gpu_idle_share": _mean([g["idle_share"] for g in gpus if g["idle_share"] is not None]),
        "nccl_share": _ratio(sum(g["nccl_time_s"] for g in gpus), sum(g["kernel_time_s"] for g in gpus)),
        **_gpu_overall(gpus), **_comm_overall([r["comm"] for r in ranks if r["comm"]], batch_total),
    }


def _gpu_overall(gpus: list[dict]) -> dict:
    """The GPU-side view, pooled: each phase's GPU time and the data stall as shares of the
    GPUs' training time (epochs x devices)."""
    training = sum(g["training_s"] or 0.0 for g in gpus)
    return {"gpu_phase_shares": {p: _ratio(sum(g["phase_kernel_s"][p] for g in gpus), training) for p in GPU_PHASES}
            if gpus else None,
            "gpu_data_stall_share": _ratio(sum(g["data_stall_s"] or 0.0 for g in gpus), training) if gpus else None}


def _comm_overall(comms: list[dict], batch_total: float) -> dict:
    if not comms:
        return {"comm_share": None, "comm_exposed_share": None, "comm_overlap_share": None}
    seconds = sum(c["seconds"] for c in comms)
    exposed = sum(c["exposed_s"] for c in comms)
    return {"comm_share": _ratio(seconds, batch_total), "comm_exposed_share": _ratio(exposed, batch_total),
            "comm_overlap_share": _ratio(seconds - exposed, seconds)}


def _compare(rank0: dict, metrics: dict) -> list[dict]:
    """nsys `epoch e` on the first rank vs the metrics' epochs[].time_s (rank 0's timer).

    Epochs are matched by number, so a resumed run's earlier epochs are skipped.
    """
    nsys = {e["epoch"]: e["time_s"] for e in rank0["epochs"]}
    rows = []
    for i, entry in enumerate(metrics.get("epochs") or []):
        epoch, timed = entry.get("epoch", i), entry.get("time_s")
        if epoch in nsys and timed:
            rows.append({"epoch": epoch, "nsys_s": nsys[epoch], "metrics_s": timed,
                         "diff_share": (nsys[epoch] - timed) / timed})
    return rows


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
