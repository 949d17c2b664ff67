"""The lab page: every report of a folder side by side, one per mode and GPU count (docs/PROFILING.md).

    python -m handler.profiling.report nsight_logs/ --out lab/     (the kit's <mode>_<time>/gpu_<N>.nsys-rep)
    python -m handler.profiling.report dp_1gpu.nsys-rep ddp_2gpu.nsys-rep --lab --out lab/

Writes OUT/lab.md, OUT/lab.json and one figure per report (figures.py). A report's cell (mode and
count) comes from cells.py; where it holds no count, from the GPUs that ran kernels (or the ranks,
on CPU). Beside the cell the page says what ran, read from the report: "2 GPUs", "2 CPU processes".
No two reports share a cell, a figure or an export. Each report gets a verdict line with its bound,
see `verdict`. A report that cannot be read is left off and named (build_lab).
"""
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Any, TypedDict, cast

from pydantic import BaseModel

from handler.runtime.errors import UserError, shown
from handler.runtime.names import EPOCH

from ..analysis import summarize
from .figures import draw
from ..gpu_metrics.render import lab_cell, lab_columns
from ..nsys import sqlite_export
from ..trace import Trace, load_trace
from ..scaling.epochs import RULE as EPOCH_RULE, of_summary, short as epoch_note
from ..scaling.epochs import Measured
from ..scaling.facts import job_split
from ..scaling.links import hook_of
from ..scaling.machine import machine_of
from ..scaling.step import bound_of, own_terms, step_of
from ..record.metrics import Metrics
from ..record.parse import parse_summary
from ..record.summary import CommConfig, Gpu, Incomplete, Machine, PcieOverlap, Rank, Run, Summary, Unplaced
from .whatif_folder import lab_section
from ..scaling.run_facts import run_block
from .cells import metrics_beside

BOUND_RULE = ("The bound is what remains of one epoch with a loader that keeps up: the wait for data removed "
              "(between the step ranges, and the `data` and `h2d` phases inside them, whichever the loop used), per "
              "step the larger of the host's work inside the step and the GPU's busy time (kernels run "
              "asynchronously, so they can outlast the range), plus the communication no compute hid, times the "
              "steps of one epoch: the what-if's \"loader keeps up\" epoch at the report's own count "
              "(handler/profiling/scaling/step.py). It never exceeds the measured epoch. A step is bound by its "
              "largest part: loader-bound (the wait for data), GPU-bound (the GPU busy 80 % or more of the host's "
              "work: a loop that waits for its GPU, by loss.item() say, holds the GPU's work inside the step "
              "range), host-bound (the host's work, the GPU idling), CPU-bound (no GPU ran) or link-bound (the "
              "exposed communication).")


class LabRow(TypedDict):
    """A report's row of the page (lab.json's `reports`, less `summary`): its cell, what ran, the measured
    epoch, the verdict, and the parsed summary the what-if reads (whatif_folder.py)."""
    summary: Summary
    report: str
    mode: str
    model: str | None
    gpus: int
    unit: str
    cell: str
    ran: str
    processes: int
    gpus_ran: int
    convention: object
    epoch_s: float | None
    measured_epoch: Measured
    incomplete: Incomplete | None
    ranks: list[Rank]
    gpu_table: list[Gpu] | None
    verdict: dict[str, Any]
    machine: Machine
    comm_config: CommConfig | None
    run: Run | None
    pcie_overlap: PcieOverlap | None
    gpu_metrics_unplaced: Unplaced | None
    figure: dict[str, Any]
    speedup: float | None
    speedup_over_gpus: int | None
    name: str


def verdict(summary: Summary | dict[str, object]) -> dict[str, Any]:
    """The bound of one epoch and one line for a report, from its slowest rank (BOUND_RULE says how)."""
    summary = parse_summary(summary, "the summary")
    try:
        split = job_split(summary)[0]
    except UserError as err:
        return {"bound_s": None, "bound": None, "line": f"no bound: {err}"}
    if split.step <= 0:  # every step range of zero length: there is no time to split
        return {"bound_s": None, "bound": None, "line": "no bound: the report's steps last no measurable time"}
    terms = own_terms(split)
    _, keeps_up = step_of(terms, split.gpu)
    bound, step_ms = bound_of(terms), split.step * 1e3
    busy_ms = split.busy * 1e3 if split.gpu else None
    detail = {"loader-bound": f"{split.wait / split.step * 100:.0f} % of each step waits for data",
              "link-bound": f"{split.exposed * 1e3:.1f} ms of each {step_ms:.1f} ms step waits for communication",
              "CPU-bound": f"no GPU ran; the host computes {split.host * 1e3:.1f} ms of each {step_ms:.1f} ms step",
              "GPU-bound": f"the busiest GPU works {busy_ms or 0:.1f} ms of each {step_ms:.1f} ms step "
                           f"({_share(busy_ms or 0, split.host * 1e3)} of the host's work inside it)",
              "host-bound": f"the busiest GPU idles {_share(split.host * 1e3 - (busy_ms or 0), split.host * 1e3)} of "
                            f"the host's work inside the step ({busy_ms or 0:.1f} ms busy of {split.host * 1e3:.1f} "
                            f"ms, each {step_ms:.1f} ms step)"}[bound]
    bound_s = split.steps_per_epoch * keeps_up
    epoch_s = split.steps_per_epoch * split.step
    return {"bound_s": bound_s, "bound": bound, "epoch_s": epoch_s, "per_step_ms": keeps_up * 1e3,
            "steps_per_epoch": split.steps_per_epoch, "gpu_busy_ms_per_step": busy_ms,
            "wait_share": split.wait / split.step, "terms_ms": {k: v * 1e3 for k, v in terms.items()},
            "line": f"{bound}: {detail}; with a loader that keeps up, the epoch takes at least {bound_s:.3g} s "
                    f"({split.steps_per_epoch:g} steps x {keeps_up * 1e3:.1f} ms) of the {epoch_s:.3g} s measured"
                    + (f" ({epoch_note(split.measured)}: the bound moves with it)"
                       if split.measured and split.measured["noisy"] else "")}


def _share(part: float, whole: float) -> str:
    return f"{part / whole * 100:.0f} %" if whole else "n/a"


def write_cells_lab(cells: list[tuple[str, int, Path, Metrics | None]], out: Path) -> Path | None:
    """The lab page of a comparison (handler.compare): (label, process count, report, the run's
    metrics) per profiled cell that finished, so each cell's what-if takes its own model's
    gradients; the report's .sqlite export stands in where only it is left. A cell whose report
    cannot be read is left off the page and named on it; with none readable the page is not
    written, and one line says why."""
    entries: list[dict[str, Any]] = []
    for label, count, report, metrics in cells:
        found = report if report.is_file() else report.with_suffix(".sqlite")
        if found.is_file():
            entries.append({"report": found, "mode": label, "gpus": count, "metrics": metrics,
                            "model": metrics.config.model if metrics else None})
    if not entries:
        return None
    try:
        write_lab(entries, out)
    except UserError as err:
        print(f"compare: no lab page: {err}", flush=True)
        return None
    return out / "lab.md"


def write_lab(entries: list[dict[str, Any]], out: Path, convention: Any = None) -> str:
    """Writes out/lab.md, out/lab.json and the figures; returns the page. A report that cannot
    be read is left off: the page's "Reports left off" and lab.json's `left_off` name it and why,
    and so does one loud line each on stderr (say_left_off). UserError (no page) when none can be read."""
    page, left_off = build_lab(entries, out, convention)
    say_left_off(left_off, len(entries), out)
    return page


def say_left_off(left_off: list[dict[str, str]], total: int, out: Path) -> None:
    """One line on stderr per report left off the page, and how many; nothing when none was."""
    for bad in left_off:
        print(f"lab page: LEFT OFF: {shown(bad['why'])}", file=sys.stderr, flush=True)
    if left_off:
        print(f"lab page: {len(left_off)} of {total} reports left off (listed under 'Reports left off' in "
              f"{out / 'lab.md'}); the page covers the other {total - len(left_off)}", file=sys.stderr, flush=True)


def build_lab(entries: list[dict[str, Any]], out: Path, convention: Any = None) -> tuple[str, list[dict[str, str]]]:
    """write_lab's work, saying nothing: the page and the reports left off ({"report", "why"})."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[LabRow] = []
    left_off: list[dict[str, str]] = []
    exports = _unique([f"{e['report'].parent.name}_{e['report'].stem}" for e in entries])
    try:
        for entry, export in zip(entries, exports):
            try:
                row, trace = _row(entry, out / "exports" / export, convention)
            except UserError as err:
                left_off.append({"report": str(entry["report"]), "why": str(err)})
                _remove_empty(out / "exports" / export, out / "exports")
                continue
            # Drawn now, so one trace is held at a time; named once every row's cell is known (_apart).
            report = entry["report"]
            row["figure"] = draw(trace, out / f".{export}.png",
                                 shown(f"{row['mode']}, {_label(row)}: {report.parent.name}/{report.name}"))
            rows.append(row)
        if not rows:
            raise UserError(f"no lab page: none of the {len(entries)} reports can be read: "
                            + "; ".join(b["why"] for b in left_off))
        _apart(rows)
        for row in rows:
            figure = out / f"{row['name']}.png"
            Path(row["figure"]["file"]).replace(figure)
            row["figure"]["file"] = str(figure)
    finally:  # a figure not yet named is never left behind, whatever stopped the page
        for export in exports:
            (out / f".{export}.png").unlink(missing_ok=True)
    for row in rows:
        base = min((r for r in rows if r["mode"] == row["mode"] and r["epoch_s"]), key=lambda r: r["gpus"], default=None)
        row["speedup"] = base_s / own if base and (base_s := base["epoch_s"]) and (own := row["epoch_s"]) else None
        row["speedup_over_gpus"] = base["gpus"] if base else None
    rows.sort(key=lambda r: (r["mode"], r["gpus"]))
    (out / "lab.json").write_text(json.dumps({"schema": 1, "bound_rule": BOUND_RULE, "reports": [_saved(r) for r in rows],
                                              "left_off": left_off}, indent=2))
    page = shown("\n".join(_page(rows, left_off) + lab_section(rows)))
    (out / "lab.md").write_text(page)
    return page, left_off


def _row(entry: dict[str, Any], exports: Path, convention: Any) -> tuple[LabRow, Trace]:
    """One report's row of the page, and its trace for the figure. UserError when it cannot be read."""
    sqlite = sqlite_export(entry["report"], exports)
    metrics = entry.get("metrics") or metrics_beside(entry["report"], strict=True)
    data = metrics.model_dump(by_alias=True, exclude_unset=True) if metrics else None  # the report's writer reads it as data
    trace = load_trace(sqlite, convention)
    written = summarize(trace, report=entry["report"])  # metrics as data only: summarize's hook defaults import torch
    written["run"] = run_block(written, data, entry["report"])  # the run's own facts from its metrics first
    written["machine"] = machine_of(sqlite, written["ranks"], data, trace.processes)
    summary = parse_summary(written, str(entry["report"]), "the report's summary breaks its contract "
                            "(docs/summary.schema.json): report it, with the report, as a bug")
    return summary_row(summary, entry, metrics), trace


RANK_FIELDS = {"rank", "epochs", "loop", "setup", "setup_libraries", "nccl_ranges", "comm", "pipeline"}


def summary_row(summary: Summary | dict[str, object], entry: dict[str, Any], metrics: Metrics | None = None) -> LabRow:
    """A report's row of the page from its parsed summary (a dict is parsed first): {"report", "mode", "gpus",
    "model"} of `entry` and the run's metrics. handler.compare builds its rows here too (from each cell's
    summary JSON), so both pages measure and predict a cell alike (whatif_folder.folder_predictions)."""
    summary = parse_summary(summary, str(entry["report"]))
    ran_gpus, processes = len(summary.gpus or ()), len(summary.ranks)
    gpus = entry["gpus"] or ran_gpus or processes
    unit = "GPU" if ran_gpus else "CPU process"
    measured = of_summary(summary)
    summary = summary.model_copy(update={"run_mode": entry["mode"], "report": str(entry["report"]),
                                         "comm_config": hook_of(metrics), "model": entry.get("model")})
    return {"summary": summary, "report": str(entry["report"]), "mode": entry["mode"], "model": entry.get("model"),
            "gpus": gpus, "unit": unit, "cell": _count(gpus, unit), "ran": _ran(processes, ran_gpus),
            "processes": processes, "gpus_ran": ran_gpus, "convention": getattr(summary, "convention", None),
            "epoch_s": measured["s"], "measured_epoch": measured, "incomplete": summary.incomplete,
            "ranks": summary.ranks, "gpu_table": summary.gpus or None,
            "verdict": verdict(summary), "machine": summary.machine or Machine(),
            "comm_config": summary.comm_config, "run": summary.run, "pcie_overlap": report_overlap(summary),
            "gpu_metrics_unplaced": summary.gpu_metrics_unplaced, "figure": {}, "speedup": None,
            "speedup_over_gpus": None, "name": ""}


def report_overlap(summary: Summary) -> PcieOverlap | None:
    """The PCIe overlap of a whole report, every rank's GPUs pooled; None where no GPU sampled both directions."""
    found = [o for r in summary.ranks for o in (r.pcie_overlap or {}).values()]
    if not found:
        return None
    tx, both = sum(o.tx_busy_samples for o in found), sum(o.both_busy_samples for o in found)
    # the pooled counts may pass a count's bound (many GPUs); each part was validated
    return PcieOverlap.model_construct(tx_busy_samples=tx, both_busy_samples=both, share=min(both, tx) / tx if tx else None,
                                       busy_at=found[0].busy_at)


def _saved(row: LabRow) -> dict[str, Any]:
    """lab.json's entry of a row: its fields as JSON, the parsed summary left out (its report's own), of its
    ranks the fields RANK_FIELDS names."""
    def as_json(key: str, value: object) -> object:
        if isinstance(value, list) and key == "ranks":
            return [r.model_dump(mode="json", include=RANK_FIELDS) for r in cast(list[Rank], value)]
        if isinstance(value, list):
            return [v.model_dump(mode="json", by_alias=True) if isinstance(v, BaseModel) else v for v in cast(list[object], value)]
        return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value
    return {k: as_json(k, v) for k, v in row.items() if k != "summary"}


def _remove_empty(*folders: Path) -> None:
    """The export folders a report that could not be read left empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _ran(processes: int, gpus: int) -> str:
    """What a report shows ran: "2 GPUs", "1 process on 2 GPUs" (DP), "2 CPU processes"."""
    if not gpus:
        return _count(processes, "CPU process")
    return _count(gpus, "GPU") if gpus == processes else f"{_count(processes, 'process')} on {_count(gpus, 'GPU')}"


def _apart(rows: list[LabRow]) -> None:
    """Two reports in one cell (mode, count) both get their report's folder and name beside the
    mode; then every row's name (its figure's file) is made unique and safe for a file name."""
    cells = [(r["mode"], r["gpus"]) for r in rows]
    for row, cell in zip(rows, cells):
        if cells.count(cell) > 1:
            report = Path(row["report"])
            row["mode"] = f"{row['mode']} ({report.parent.name}/{report.stem})"
    names = _unique([f"{r['mode']}_{r['gpus']}{'gpu' if r['unit'] == 'GPU' else 'cpu'}" for r in rows])
    for row, name in zip(rows, names):
        row["name"] = name


def _unique(names: list[str]) -> list[str]:
    """The names with only filename-safe characters, at most 200, a clash numbered (-2, -3, ...)."""
    out: list[str] = []
    for name in names:
        safe = re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip("-")[:200] or "report"  # + .png, .sqlite: < 255 bytes
        candidate, k = safe, 1
        while candidate in out:
            k += 1
            candidate = f"{safe}-{k}"
        out.append(candidate)
    return out


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "es" if unit.endswith("s") else "s")


def _label(row: LabRow) -> str:
    """The cell as the page names it, and what ran where that differs: "2 CPU processes (ran 1 CPU process)"."""
    return row["cell"] + ("" if row["ran"] == row["cell"] else f" (ran {row['ran']})")


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f} %"


def _column(rows: list[LabRow], count: int) -> str:
    units = {r["unit"] for r in rows if r["gpus"] == count}
    return _count(count, units.pop()) if len(units) == 1 else f"{_count(count, 'GPU')} or {_count(count, 'CPU process')}"


def _page(rows: list[LabRow], left_off: list[dict[str, str]]) -> list[str]:
    modes, counts = sorted({r["mode"] for r in rows}), sorted({r["gpus"] for r in rows})
    cell = {(r["mode"], r["gpus"]): r for r in rows}
    lines = ["# Lab profiles", ""]
    if left_off:
        lines += ["## Reports left off", "", f"{len(left_off)} of {len(left_off) + len(rows)} reports could not be read "
                  "and are not on this page:", "", *(f"- {bad['why']}" for bad in left_off), ""]
    lines += ["## Epoch time and speed-up", "",
             "Epoch time in s, the measured epoch (speed-up over the same mode on its fewest GPUs or processes; the "
             "epochs used and their spread); where a run did not use what its cell asked for, what ran is beside it. "
             + EPOCH_RULE, "",
             "| mode | " + " | ".join(_column(rows, n) for n in counts) + " |", "|---" * (len(counts) + 1) + "|"]
    for mode in modes:
        lines.append(f"| {mode} | " + " | ".join(
            (f"{_num(c['epoch_s'])} ({_num(c['speedup'])}x; {epoch_note(c['measured_epoch'])})"
             if c["epoch_s"] is not None else "no complete epoch")
            + ("" if c["ran"] == c["cell"] else f", ran {c['ran']}")
            + _cut_note(c)
            if (c := cell.get((mode, n))) else "" for n in counts) + " |")
    lines += ["", "## Verdicts", "", "One line a report: its bound for one epoch, how it is found in "
              "[the lab page's docs](docs/PROFILING.md#the-lab-page) (and lab.json's `bound_rule`).", ""]
    lines += [f"- **{r['mode']}, {_label(r)}**: " + (f"cut short: {cut.line}; " if (cut := r["incomplete"]) else "")
              + f"{r['verdict']['line']}." for r in rows]
    lines += _gpu_tables(rows)
    lines += ["", "## Figures", "", "| " + " | ".join(r["name"] for r in rows) + " |", "|---" * len(rows) + "|",
              "| " + " | ".join(f"![{r['name']}]({Path(r['figure']['file']).name})" for r in rows) + " |", ""]
    return lines


def _metric_lines(rows: list[LabRow]) -> list[str]:
    """Per report with GPU metrics: the PCIe overlap (docs/PROFILING.md) and one line per kind of value it could not place."""
    lines: list[str] = []
    for r in rows:
        if overlap := r["pcie_overlap"]:
            lines.append(f"- {r['name']}: PCIe RX busy during {_pct(overlap.share)} of the time TX is busy "
                         f"({overlap.busy_at}; {overlap.tx_busy_samples} TX-busy samples)" if overlap.share is not None
                         else f"- {r['name']}: PCIe TX never busy ({overlap.busy_at}) inside the epochs")
        unplaced = r["gpu_metrics_unplaced"]
        lines += [f"- {r['name']}: {line}" for line in (unplaced.lines if unplaced else ())]
        lines += [f"- {r['name']}: GPU metrics not read: {unread}"] if (unread := r["summary"].gpu_metrics_unread) else []
    return ["", *lines] if lines else []


def _cut_note(row: LabRow) -> str:
    """", cut short in epoch 3" beside the epoch time of a run that ended inside an epoch."""
    cut = row["incomplete"]
    return f", cut short in {EPOCH(cut.epoch)}" if cut else ""


def _gpu_tables(rows: list[LabRow]) -> list[str]:
    """Per GPU and Copies; where no row has a line, one line saying why instead of a bare header."""
    without = [r["name"] for r in rows if not r["gpu_table"]]
    none_here = (f"No CUDA activity in {'these reports' if len(without) == len(rows) else ', '.join(without)}"
                 " (CPU runs): no GPU to show.") if without else ""
    metric_keys = lab_columns([g.metrics for r in rows for g in r["gpu_table"] or ()])
    per_gpu = ["| " + " | ".join([r["name"], str(g.device), _pct(g.kernel_busy_share), _pct(g.compute_busy_share),
                                   _num(g.nccl_kernel_s, 3), _num(g.peak_memory_mb, 0),
                                   *(lab_cell(g.metrics, k) for k in metric_keys)]) + " |"
               for r in rows for g in r["gpu_table"] or ()]
    lines = ["", "## Per GPU", "", "Busy shares are of the epochs' length; GPU metrics (nsys' sampling, percent of "
             "peak unless a rate) are means inside the epochs.", ""]
    if per_gpu:
        lines += ["| " + " | ".join(["report", "GPU", "kernel busy", "compute busy", "NCCL kernel s", "peak MB",
                                     *metric_keys]) + " |", "|---" * (6 + len(metric_keys)) + "|", *per_gpu]
    lines += [none_here] if none_here else []
    lines += _metric_lines(rows)
    copies = [f"| {r['name']} | {g.device} | {kind} | {c.count} | {_num(c.mb, 1)} | {_num(c.seconds, 4)} |"
              for r in rows for g in r["gpu_table"] or () for kind, c in g.memcpy.items()]
    lines += ["", "## Copies (memcpy inside the epochs)", ""]
    if copies:
        lines += ["| report | GPU | kind | count | MB | s |", "|---|---|---|---|---|---|", *copies]
    elif per_gpu:
        lines.append("No memcpy recorded inside the epochs of the GPU runs.")
    lines += [none_here] if none_here else []
    return lines
