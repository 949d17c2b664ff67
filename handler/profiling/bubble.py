"""The pipeline bubble per stage, from the pp NVTX ranges (DESIGN.md §4 and §7).

Inside each training batch, a stage's pipeline span runs from its first `fwd mb{j}`,
`bwd mb{j}`, `send` or `recv` range to its last one. Busy is the time in `fwd`/`bwd`
ranges; the bubble is the rest of the span (waiting for a neighbour, sending), so
busy + bubble = 1. Theory for W stages and M equal micro-batches: (W-1)/(M+W-1), the
same for GPipe and 1F1B (1F1B saves activation memory, not bubble).
"""
import bisect
import re

from .trace import Process

WORK = re.compile(r"(fwd|bwd) mb(\d+)")
WAIT = ("send", "recv")
BATCH = re.compile(r"batch \d+")


def theoretical_bubble(stages: int, microbatches: int) -> float:
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_stats(processes: tuple[Process, ...]) -> list[dict | None]:
    """One entry per process (same order): its pipeline numbers, or None without pp ranges."""
    stages = [p for p in processes if any(WORK.fullmatch(r.name) for r in p.ranges)]
    if not stages:
        return [None] * len(processes)
    microbatches = 1 + max(int(m.group(2)) for p in stages for r in p.ranges if (m := WORK.fullmatch(r.name)))
    theory = theoretical_bubble(len(stages), microbatches)
    return [_stage(p, stages.index(p), theory) if p in stages else None for p in processes]


def _stage(process: Process, index: int, theory: float) -> dict:
    pieces = sorted((r for r in process.ranges if WORK.fullmatch(r.name) or r.name in WAIT), key=lambda r: r.start)
    starts = [r.start for r in pieces]
    span = busy = wait = 0
    for batch in (r for r in process.ranges if BATCH.fullmatch(r.name)):
        inside = [r for r in pieces[bisect.bisect_left(starts, batch.start):bisect.bisect_right(starts, batch.end)]
                  if r.end <= batch.end]
        if inside:
            span += max(r.end for r in inside) - inside[0].start
            busy += sum(r.end - r.start for r in inside if r.name not in WAIT)
            wait += sum(r.end - r.start for r in inside if r.name in WAIT)
    return {"stage": index, "busy_share": busy / span if span else None,
            "bubble_share": 1 - busy / span if span else None, "theoretical_bubble_share": theory,
            "wait_share": wait / span if span else None, "span_s": span / 1e9}


def markdown_lines(ranks: list[dict]) -> list[str]:
    """The report's pipeline section; empty for runs without pp ranges."""
    rows = [r["pipeline"] for r in ranks if r.get("pipeline")]
    if not rows:
        return []
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    lines = ["## Pipeline (pp)", "",
             "Shares of each stage's pipeline span inside the training batches; the bubble is idle "
             "time (waiting in send/recv included); theory is (W-1)/(M+W-1).", "",
             "| rank | stage | busy | bubble | theoretical bubble | send/recv |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['rank']} | {p['stage']} | {pct(p['busy_share'])} | {pct(p['bubble_share'])} | "
              f"{pct(p['theoretical_bubble_share'])} | {pct(p['wait_share'])} |"
              for r, p in ((r, r["pipeline"]) for r in ranks if r.get("pipeline"))]
    return lines + [""]
