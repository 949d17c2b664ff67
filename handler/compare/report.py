"""report.md and results.json of a comparison."""
import json
from pathlib import Path
from typing import Any

from ..profiling.scaling.epochs import RULE as EPOCH_RULE, short as epoch_note
from ..runtime.errors import shown
from ..runtime.names import BACKWARD, DATA_GPU, FORWARD, OPTIMIZER
from .predict import markdown as prediction_lines
from .provenance import markdown as provenance_lines
from .results import SHARES, Row

NA = "—"
SHORT = {FORWARD: "fwd", BACKWARD: "bwd", OPTIMIZER: "opt", DATA_GPU: "data (GPU)"}  # the rest as named


def num(value: float | None, fmt: str) -> str:
    return NA if value is None else format(value, fmt)


def pct(share: float | None) -> str:
    return NA if share is None else f"{100 * share:.0f} %"


def status(row: Row) -> str:
    return f"failed (exit {row.exit_code})" if row.status == "failed" else row.status


def phases(row: Row) -> str:
    if not row.phases:
        return NA
    shares = " · ".join(f"{SHORT.get(p, p)} {100 * row.phases[p]:.0f}%" for p in SHARES if row.phases[p] >= 0.005)
    return shares if row.phase_source == "nsys" else f"{shares} ({row.phase_source})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def results_table(rows: list[Row]) -> list[str]:
    header = ["cell", "mode", "procs", "options", "status", "epoch s", "epochs used", "images/s", "speed-up (ideal)",
              "efficiency", "data wait", "test acc", "phase shares", "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        speedup = NA if r.speedup is None else f"{r.speedup:.2f}x ({r.ideal:g}x)"
        values = [r.name, r.mode, str(r.count), f"`{r.options}`" if r.options else "", status(r),
                  num(r.epoch_s, ".2f"), f"{epoch_note(r.measured)} ({r.epoch_from})" if r.measured else NA,
                  num(r.images_per_s, ".0f"), speedup, pct(r.efficiency),
                  pct(r.data_wait_share), pct(r.test_acc), phases(r), r.error]
        lines.append("| " + " | ".join(_cell(v) for v in values) + " |")
    return lines


def markdown(rows: list[Row], plots: dict[str, str], prov: dict[str, Any], recipe: dict[str, object], dataset: str,
             profiled: bool) -> str:
    title = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in recipe.items()) or "no cell finished"
    timing = ("every cell ran under nsys (scripts/launch.sh PROFILE=1): times include its small NVTX overhead"
              if profiled else "cells ran without a profiler (scripts/launch.sh PROFILE=0)")
    lines = [f"# Mode comparison: {title}", "",
             f"Epoch time is the measured epoch, as the lab page's: {EPOCH_RULE} A profiled cell's comes from its "
             "nsys epoch ranges, another's from its metrics JSON's epoch timer (`epochs used` says which). "
             "images/s is the metrics' median over the epochs after the first (or the only epoch). "
             "Speed-up is against the same variant's smallest process count; efficiency is speed-up "
             "÷ ideal. Data wait is the share of epoch time spent waiting for the loader (metrics JSON). "
             "Phase shares are of training-batch time from the nsys NVTX ranges (docs/PROFILING.md), "
             "pooled over ranks; `other` is batch time no phase covers.", "",
             "## Results", "", *results_table(rows), "", *prediction_lines(rows)]
    lines += [f"### {title}\n\n![{title}]({name})\n" for title, name in plots.items()]
    lines += ["## Provenance", "",
              *provenance_lines(prov, {"dataset": dataset, "timing": timing,
                                       "cells": f"{len(rows)} ({sum(r.status == 'ok' for r in rows)} ok)"}),
              "", "## Reproduce one cell", "",
              "Each cell's logs, metrics JSON (and nsys report) are in its folder.", "",
              "| cell | folder | command |", "|---|---|---|"]
    lines += [f"| {_cell(r.name)} | {r.folder or NA} | `{_cell(r.command)}` |" for r in rows if r.command]
    return "\n".join(lines) + "\n"


def write_report(out: Path, rows: list[Row], plots: dict[str, str], prov: dict[str, Any], recipe: dict[str, object],
                 dataset: str, profiled: bool) -> Path:
    page = markdown(rows, plots, prov, recipe, dataset, profiled)
    (out / "report.md").write_text(shown(page))
    data = {"schema": 1, "provenance": prov, "dataset": dataset, "profiled": profiled, "recipe": recipe,
            "plots": plots, "cells": [r.as_dict() for r in rows]}
    (out / "results.json").write_text(json.dumps(data, indent=2))
    return out / "report.md"
