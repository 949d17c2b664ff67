"""The summary for people: a markdown page and the one line scripts/launch.sh prints."""
from handler.runtime.names import DATA, DATA_GPU, OUTSIDE_TRAINING, PHASES

from .analysis import GPU_PHASES
from .bubble import markdown_lines
from .gpu_metrics.render import sections as gpu_metric_sections
from .scaling.epochs import line as measured_line, of_written
from .scaling.machine import machine_line

NA = "n/a"
LABELS = {DATA: "data-stall"}  # waiting for the loader is what the data phase measures
GPU_LABELS = {DATA_GPU: "data (GPU)"}  # the input pipeline's own GPU work (DALI, nvJPEG)


def pct(share: float | None) -> str:
    return NA if share is None else f"{share * 100:.1f} %"


def num(value: float | None, digits: int = 2) -> str:
    return NA if value is None else f"{value:.{digits}f}"


def one_line(summary: dict) -> str:
    """CPU runs: shares of batch time from the NVTX ranges. GPU runs: the GPU-side view,
    shares of the GPUs' training time spent on work each phase launched, and data-stall as
    GPU idle while the CPU waits for data."""
    overall = summary["overall"]
    gpu = summary["gpu_trace"] and overall.get("gpu_phase_shares") is not None
    shares = overall["gpu_phase_shares"] if gpu else overall["phase_shares"]
    # An absent phase (h2d on CPU) took no time.
    parts = [f"{LABELS.get(p, p)} {pct(shares[p] or 0.0)}" for p in PHASES]
    if gpu:
        parts[0:1] = [f"data-stall {pct(overall['gpu_data_stall_share'] or 0.0)}",
                      f"{GPU_LABELS[DATA_GPU]} {pct(shares.get(DATA_GPU) or 0.0)}"]
    parts.append(f"epoch {num(of_written(summary)['s'])} s")  # the measured epoch, as every page's (scaling/epochs.py)
    if summary["gpu_trace"]:
        parts += [f"gpu idle {pct(overall['gpu_idle_share'])}", f"nccl {pct(overall['nccl_share'])}"]
    if overall.get("comm_share") is not None:
        parts.append(f"comm {pct(overall['comm_share'])} (exposed {pct(overall['comm_exposed_share'])})")
    if summary.get("convention", "ours") != "ours":  # their loops mark no data fetch: it waits between steps
        loops = [r["loop"] for r in summary["ranks"] if r.get("loop") and r["loop"]["step_mean_ms"]]
        step_ms = sum(lp["step_mean_ms"] for lp in loops)
        between = sum(lp["between_steps_ms"] or 0.0 for lp in loops) / step_ms if loops else None
        data = sum(lp.get("between_steps_data_ms") or 0.0 for lp in loops) / step_ms if loops else 0.0
        parts.append(f"between steps {pct(between)}" + (f" (data ranges {pct(data)})" if data else ""))
    window = covered(summary.get("capture_window")) if (summary.get("capture_window") or {}).get("outside") else ""
    return "profile: " + ", ".join(parts) + (" [GPU time]" if gpu else "") + (f" [{window}]" if window else "")


def covered(window: dict | None) -> str:
    """"epochs 1-2 of 4": which epochs the report holds, of how many the run trained. The one
    line names it only when the report leaves some of the run's epochs out."""
    if not window or not window["epochs"]:
        return ""
    epochs, total = window["epochs"], window["run_epochs"]
    span = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}"
    if len(epochs) != epochs[-1] - epochs[0] + 1:
        span = "epochs " + ",".join(map(str, epochs))
    return span + (f" of {total}" if total else "")


def run_line(run: dict | None) -> list[str]:
    """The run's own facts, each with where it came from (scaling/run_facts.py): a mode read from the file
    name says so here."""
    if not run:
        return []
    pp = (f"; pp: {run['pp_stages']} stages, {run['pp_microbatches'] or '?'} micro-batches ({run['pp_from']})"
          if run.get("pp_stages") else "")
    return [f"Run: mode {run['mode'] or '?'} ({run['mode_from']}); model {run['model'] or '?'} ({run['model_from']}); "
            f"gradients {num(run['grad_mb']) + ' MB' if run['grad_mb'] else '?'} ({run['grad_mb_from']}); "
            f"{run['nodes']} node(s), "
            f"{run['gpus_per_node']} GPU(s) per node, {run['processes']} process(es){pp}.", ""]


def markdown(summary: dict, title: str) -> str:
    ranks = summary["ranks"]
    trace = "GPU trace (CUDA activity recorded)" if summary["gpu_trace"] else "CPU-only trace (no CUDA activity)"
    convention = summary.get("convention") or "ours"
    lines = [f"# Profile: {title}", "",
             f"{len(ranks)} rank(s), ranks from {summary['rank_source']}; {trace}; "
             f"ranges read by the {convention} naming convention (docs/PROFILING.md).", "",
             f"`{one_line(summary)}`", "", *run_line(summary.get("run")),
             *([line, ""] if (line := machine_line(summary.get("machine"))) else [])]
    window = summary.get("capture_window") or {}
    outside = ", ".join(f"{o['epoch']}: {num(o['metrics_s'])} s" for o in window.get("outside") or [])
    numbering = ("Epochs count from 0, as NVTX and --profile-epochs do; the console's epoch line shows N+1. "
                 f"{measured_line(of_written(summary), 'The measured epoch (what the lab page and the what-if use)')}.")
    lines += _section("Epoch time (s)", f"This report covers {covered(window)}; the others were not captured. "
                      f"Their times from the metrics JSON: {outside}. {numbering}" if outside else numbering,
                      *_epoch_table(ranks))
    lines += _section("Training batches",
                      "Phase shares are of summed batch time; data-stall is time waiting for the loader."
                      + (f" **Phases not read**: {summary['phases_unmatched']}." if summary.get("phases_unmatched")
                         else ""),
                      ["rank", "batches", "mean ms", "p50 ms", "p95 ms", "p99 ms",
                       *(LABELS.get(p, p) for p in PHASES), "other"],
                      [_batch_row(r) for r in ranks])
    lines += _section("Outside training batches (count / s)", None, ["rank", *OUTSIDE_TRAINING],
                      [[who(r), *(_count_time(r["outside_training"][n]) for n in OUTSIDE_TRAINING)]
                       for r in ranks])
    if summary["gpu_trace"]:
        lines += _section("GPU", "Idle, data-stall and data (GPU) are shares of the GPUs' time inside training "
                          "epochs; data-stall is GPU idle while the training thread waits in `data`, data (GPU) "
                          "the input pipeline's own GPU work (DALI's operators, nvJPEG).",
                          ["rank", "devices", "kernels", "kernel s", "idle", "data-stall", "data (GPU)",
                           "nccl share of kernel time"],
                          [_gpu_row(who(r), r["gpu"]) for r in ranks])
        lines += _section("GPU time per phase (s)", "Kernels, copies and memsets, by the phase whose range was "
                          "open on the launching thread when the CUDA call started; data (GPU) is work the "
                          "input pipeline launched from its own threads or in its own kernels.",
                          ["rank", *(GPU_LABELS.get(p, p) for p in GPU_PHASES), "unattributed"],
                          [[who(r), *(num(r["gpu"]["phase_kernel_s"][p], 3) for p in GPU_PHASES),
                            num(r["gpu"]["unattributed_s"], 3)] for r in ranks])
    else:
        lines += ["## GPU", "", f"{NA}: no CUDA activity in this report (CPU-only run).", ""]
    lines += loop_sections(summary)
    lines += _comm_sections(summary)
    lines += gpu_metric_sections(summary, who, _section)
    lines += markdown_lines(ranks, who)
    if summary.get("metrics_comparison") is not None:
        lines += _section("nsys vs metrics JSON (epoch time, first rank)",
                          None if summary["metrics_comparison"] else "No epoch appears in both.",
                          ["epoch", "nsys s", "metrics s", "difference"],
                          [[str(c["epoch"]), num(c["nsys_s"], 3), num(c["metrics_s"], 3), pct(c["diff_share"])]
                           for c in summary["metrics_comparison"]])
    return "\n".join(lines)


def loop_sections(summary: dict) -> list[str]:
    """Steps per rank (inside the step ranges and between them), setup (the loop's, then the libraries'),
    NCCL's ranges, the per-GPU table."""
    ranks = [r for r in summary["ranks"] if r.get("loop")]
    lines = _section("Steps", "Step time is epoch time over steps; between steps is what no step range covers: "
                     "for a loop that does not mark its data fetch, its wait for data; of it, the time in `data` ranges (a loop "
                     "that marks its fetch there). Phases in ms per step, inside the steps.",
                     ["rank", "steps", "step ms", "inside steps ms", "between steps ms", "of it data ms",
                      *(f"{p} ms" for p in PHASES)],
                     [[who(r), str(r["loop"]["steps"]), num(r["loop"]["step_mean_ms"], 1),
                       num(r["loop"]["inside_steps_ms"], 1), num(r["loop"]["between_steps_ms"], 1),
                       num(r["loop"].get("between_steps_data_ms"), 1),
                       *(num(r["loop"]["phase_ms"][p], 2) for p in PHASES)] for r in ranks])
    setup = [[who(r), s["name"], str(s["count"]), num(s["total_s"], 3)] for r in ranks for s in r.get("setup") or ()]
    if setup:
        lines += _section("Setup (the loop's ranges before the first epoch)", None, ["rank", "range", "count", "s"], setup)
    libraries = [[who(r), s["library"], "NVTX domain" if s["by"] == "domain" else "name prefix", str(s["count"]),
                  num(s["total_s"], 3)] for r in ranks for s in r.get("setup_libraries") or ()]
    if libraries:
        lines += _section("Setup inside libraries (their own ranges before the first epoch)",
                          "Outermost ranges per thread, grouped by library: by NVTX domain where the report names "
                          "one, else by the name's prefix (handler/profiling/conventions.py).",
                          ["rank", "library", "grouped by", "ranges", "s"], libraries)
    nccl = [[who(r), name, str(t["count"]), num(t["total_s"] * 1e3, 2)] for r in ranks
            for name, t in sorted((r.get("nccl_ranges") or {}).items())]
    if nccl:
        lines += _section("NCCL calls (NCCL's own NVTX ranges)", None, ["rank", "call", "count", "ms"], nccl)
    gpus = summary.get("gpus") or []
    if gpus:
        lines += _section("Per GPU (inside the epochs)", "Busy: the union of the GPU's kernels over the epochs' "
                          "length; compute busy leaves NCCL kernels out. Copies: count / MB / s by kind.",
                          ["GPU", "kernel busy", "compute busy", "NCCL kernel s", "peak MB", "copies"],
                          [[str(g["device"]), pct(g["kernel_busy_share"]), pct(g["compute_busy_share"]),
                            num(g["nccl_kernel_s"], 3), num(g["peak_memory_mb"], 0),
                            "; ".join(f"{k} {c['count']} / {c['mb']:.1f} / {c['seconds']:.4f}"
                                      for k, c in g["memcpy"].items()) or NA] for g in gpus])
    return lines


def who(rank: dict) -> str:
    """A rank as the per-rank tables name it: its number, and its host when known."""
    return f"{rank['rank']} ({rank['host']})" if rank.get("host") else str(rank["rank"])


def _section(title: str, note: str | None, header: list[str], rows: list[list[str]]) -> list[str]:
    lines = [f"## {title}", ""] + ([note, ""] if note else [])
    if rows:
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    return lines


def _epoch_table(ranks: list[dict]) -> tuple[list[str], list[list[str]]]:
    times = [{e["epoch"]: e["time_s"] for e in r["epochs"]} for r in ranks]
    epochs = sorted(set().union(*times))
    return (["epoch", *(f"rank {who(r)}" for r in ranks)],
            [[str(e), *(num(t.get(e)) for t in times)] for e in epochs])


def _batch_row(rank: dict) -> list[str]:
    b = rank["batches"]
    return [who(rank), str(b["count"]), *(num(b[k], 1) for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")),
            *(pct(rank["phases"][p]["share"]) for p in PHASES), pct(rank["other_share"])]


def _count_time(totals: dict) -> str:
    return f"{totals['count']} / {num(totals['total_s'])}"


def _gpu_row(rank: str, gpu: dict) -> list[str]:
    return [rank, ",".join(map(str, gpu["devices"])) or NA, str(gpu["kernels"]),
            num(gpu["kernel_time_s"]), pct(gpu["idle_share"]), pct(gpu["data_stall_share"]),
            pct(gpu["data_gpu_share"]), pct(gpu["nccl_share"])]


def _comm_sections(summary: dict) -> list[str]:
    ranks = [r for r in summary["ranks"] if r.get("comm")]
    if not ranks:
        return ["## Communication", "", f"{NA}: no `allreduce b{{k}}` ranges or NCCL kernels in this report.", ""]
    hook, cap = hook_and_buckets(summary.get("comm_config"))
    lines = _section("Communication", "Comm is the union of all-reduce time inside batches (a hook's compression "
                     "included); overlap is the part hidden behind compute, exposed the rest. Hook and bucket "
                     "size come from the run's metrics (--metrics); docs/COMM.md compares the hooks.",
                     ["rank", "hook", "bucket cap", "source", "buckets", "comm s", "share of batch time",
                      "overlapped", "exposed s"],
                     [[who(r), hook, cap, r["comm"]["source"], str(r["comm"]["buckets"]),
                       num(r["comm"]["seconds"], 3), pct(r["comm"]["share"]), pct(r["comm"]["overlap_share"]),
                       num(r["comm"]["exposed_s"], 3)] for r in ranks])
    s = summary.get("stragglers")
    if s:
        lines += _section("Stragglers", "Per step, the spread across ranks of the first all-reduce's start.",
                          ["steps", "p50 ms", "p95 ms", "max ms", "last most often", "times last per rank"],
                          [[str(s["steps"]), num(s["p50_ms"]), num(s["p95_ms"]), num(s["max_ms"]),
                            f"rank {s['most_often_last']}",
                            ", ".join(f"{r}: {n}" for r, n in s["last_rank_counts"].items())]])
    return lines


def hook_and_buckets(config: dict | None) -> tuple[str, str]:
    """("powersgd rank 2", "25 MB"), or n/a without the run's metrics."""
    if not config:
        return f"{NA} (no --metrics)", NA
    hook = config["hook"] + (f" rank {config['powersgd_rank']}" if config.get("powersgd_rank") else "")
    flags = [name for name, on in (("static graph", config.get("static_graph")),
                                   ("grad as bucket view", config.get("grad_as_bucket_view"))) if on]
    return hook + (f" ({', '.join(flags)})" if flags else ""), f"{config['bucket_cap_mb']:g} MB"
