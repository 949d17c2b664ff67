"""The summary for people: a markdown page and the one line scripts/launch.sh prints."""
from .analysis import OUTSIDE_TRAINING, PHASES
from .bubble import markdown_lines

NA = "n/a"
LABELS = {"data": "data-stall"}  # waiting for the loader is what the data phase measures


def pct(share: float | None) -> str:
    return NA if share is None else f"{share * 100:.1f} %"


def num(value: float | None, digits: int = 2) -> str:
    return NA if value is None else f"{value:.{digits}f}"


def one_line(summary: dict) -> str:
    overall = summary["overall"]
    # An absent phase (h2d on CPU) took no time.
    parts = [f"{LABELS.get(p, p)} {pct(overall['phase_shares'][p] or 0.0)}" for p in PHASES]
    parts.append(f"epoch {num(overall['epoch_mean_s'])} s")
    if summary["gpu_trace"]:
        parts += [f"gpu idle {pct(overall['gpu_idle_share'])}", f"nccl {pct(overall['nccl_share'])}"]
    return "profile: " + ", ".join(parts)


def markdown(summary: dict, title: str) -> str:
    ranks = summary["ranks"]
    trace = "GPU trace (CUDA activity recorded)" if summary["gpu_trace"] else "CPU-only trace (no CUDA activity)"
    lines = [f"# Profile: {title}", "",
             f"{len(ranks)} rank(s), ranks from {summary['rank_source']}; {trace}.", "",
             f"`{one_line(summary)}`", ""]
    lines += _section("Epoch time (s)", None, *_epoch_table(ranks))
    lines += _section("Training batches",
                      "Phase shares are of summed batch time; data-stall is time waiting for the loader.",
                      ["rank", "batches", "mean ms", "p50 ms", "p95 ms", "p99 ms",
                       *(LABELS.get(p, p) for p in PHASES), "other"],
                      [_batch_row(r) for r in ranks])
    lines += _section("Outside training batches (count / s)", None, ["rank", *OUTSIDE_TRAINING],
                      [[str(r["rank"]), *(_count_time(r["outside_training"][n]) for n in OUTSIDE_TRAINING)]
                       for r in ranks])
    if summary["gpu_trace"]:
        lines += _section("GPU", "Idle is over each rank's training span (first epoch start to last epoch end).",
                          ["rank", "devices", "kernels", "kernel s", "idle", "nccl share of kernel time"],
                          [_gpu_row(r["rank"], r["gpu"]) for r in ranks])
    else:
        lines += ["## GPU", "", f"{NA}: no CUDA activity in this report (CPU-only run).", ""]
    lines += markdown_lines(ranks)
    if summary.get("metrics_comparison") is not None:
        lines += _section("nsys vs metrics JSON (epoch time, first rank)",
                          None if summary["metrics_comparison"] else "No epoch appears in both.",
                          ["epoch", "nsys s", "metrics s", "difference"],
                          [[str(c["epoch"]), num(c["nsys_s"], 3), num(c["metrics_s"], 3), pct(c["diff_share"])]
                           for c in summary["metrics_comparison"]])
    return "\n".join(lines)


def _section(title: str, note: str | None, header: list[str], rows: list[list[str]]) -> list[str]:
    lines = [f"## {title}", ""] + ([note, ""] if note else [])
    if rows:
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    return lines


def _epoch_table(ranks: list[dict]) -> tuple[list[str], list[list[str]]]:
    times = [{e["epoch"]: e["time_s"] for e in r["epochs"]} for r in ranks]
    epochs = sorted(set().union(*times))
    return (["epoch", *(f"rank {r['rank']}" for r in ranks)],
            [[str(e), *(num(t.get(e)) for t in times)] for e in epochs])


def _batch_row(rank: dict) -> list[str]:
    b = rank["batches"]
    return [str(rank["rank"]), str(b["count"]), *(num(b[k], 1) for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")),
            *(pct(rank["phases"][p]["share"]) for p in PHASES), pct(rank["other_share"])]


def _count_time(totals: dict) -> str:
    return f"{totals['count']} / {num(totals['total_s'])}"


def _gpu_row(rank: int, gpu: dict) -> list[str]:
    return [str(rank), ",".join(map(str, gpu["devices"])) or NA, str(gpu["kernels"]),
            num(gpu["kernel_time_s"]), pct(gpu["idle_share"]), pct(gpu["nccl_share"])]
