"""The lab page: every report of a folder side by side, one per mode and GPU count (docs/PROFILING.md).

    python -m handler.profiling.report nsight_logs/ --out lab/     (the kit's <mode>_<time>/gpu_<N>.nsys-rep)
    python -m handler.profiling.report dp_1gpu.nsys-rep ddp_2gpu.nsys-rep --lab --out lab/

Writes OUT/lab.md, OUT/lab.json and one figure per report (figures.py). Mode and GPU count come
from the run's metrics JSON beside the report, else from the file layout; where the name holds no
GPU count, from the GPUs that ran kernels (or the ranks, on CPU). Each report gets a verdict line with its bound, see `verdict`.
"""
import json
import re
from pathlib import Path

from handler.runtime.errors import UserError

from ..analysis import summarize
from .figures import draw
from ..nsys import REPORT_SUFFIXES, sqlite_export
from ..trace import load_trace
from ..whatif import lab_section

KIT_FOLDER = re.compile(r"(?P<mode>[a-z][a-z_]*?)_\d")  # dp_20251001_173345, ddp_dali_20251001_...
KIT_FILE = re.compile(r"gpu_?(?P<gpus>\d+)", re.I)
FLAT_NAME = re.compile(r"(?P<mode>ddp_dali|ddp|dp|fsdp|pp)\b|(?P<mode2>ddp_dali|ddp|dp|fsdp|pp)_", re.I)
GPUS_IN_NAME = re.compile(r"(?:gpu_?(?P<a>\d+)|(?P<b>\d+)_?gpus?)", re.I)
LOADER_BOUND = 0.5  # a step that waits for data this much of its time is loader-bound
BOUND_RULE = ("The bound is what remains when a loader that keeps up removes the wait between steps: per step, "
              "the larger of the time inside the step range (the host's work) and the GPU's busy time (kernels "
              "run asynchronously, so they can outlast the range), times the number of steps.")


def _reports_in(folder: Path) -> list[Path]:
    found = sorted(p for p in folder.iterdir() if p.suffix in REPORT_SUFFIXES)
    return found or sorted(folder.glob("*.sqlite"))


def is_kit_layout(path: Path) -> bool:
    """A folder of <mode>_<time>/ folders holding gpu_<N> reports."""
    return path.is_dir() and any(sub.is_dir() and KIT_FOLDER.match(sub.name) and _reports_in(sub)
                                 for sub in path.iterdir())


def lab_reports(paths: list[Path]) -> list[dict]:
    """[{"report", "mode", "gpus"}] for the reports named, the kit's folders opened."""
    entries = []
    for path in paths:
        if is_kit_layout(path):
            for sub in sorted(s for s in path.iterdir() if s.is_dir() and KIT_FOLDER.match(s.name)):
                mode = KIT_FOLDER.match(sub.name).group("mode")  # type: ignore[union-attr]
                for report in _reports_in(sub):
                    count = KIT_FILE.search(report.stem)
                    entries.append({"report": report, "mode": mode, "gpus": int(count.group("gpus")) if count else None})
        else:
            for report in (_reports_in(path) if path.is_dir() else [path]):
                mode = FLAT_NAME.search(report.stem)
                count = GPUS_IN_NAME.search(report.stem)
                entries.append({"report": report, "mode": (mode.group("mode") or mode.group("mode2")).lower()
                                if mode else report.stem,
                                "gpus": int(count.group("a") or count.group("b")) if count else None})
    for entry in entries:
        entry.update(_from_metrics(entry["report"]))
    if not entries:
        raise UserError(f"no .nsys-rep or .sqlite report in {', '.join(map(str, paths))}; pass the kit's "
                        "nsight_logs folder or the reports themselves")
    return entries


def _from_metrics(report: Path) -> dict:
    """{"mode", "gpus"} from the run's metrics JSON beside the report (`<name>.metrics.json`,
    scripts/launch.sh writes it there), which knows them exactly; {} without a readable one."""
    path = report.with_name(report.name.split(".")[0] + ".metrics.json")
    try:
        config = json.loads(path.read_text()).get("config") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    found = {"mode": config.get("mode"), "gpus": config.get("num_gpu")}
    return {k: v for k, v in found.items() if v}


def verdict(summary: dict) -> dict:
    """The bound and one line for a report, from its slowest rank (BOUND_RULE says how)."""
    rank = max(summary["ranks"], key=lambda r: r["loop"]["epochs_s"])
    loop, steps = rank["loop"], rank["loop"]["steps"]
    if not steps or loop["step_mean_ms"] is None:
        return {"bound_s": None, "line": "no steps in this report: no bound"}
    busy_ms = max((g["kernel_busy_s"] * 1e3 / steps for g in summary["gpus"] or ()), default=None)
    inside, between, step = loop["inside_steps_ms"], loop["between_steps_ms"] or 0.0, loop["step_mean_ms"]
    per_step = max(inside, busy_ms or 0.0)
    bound = steps * per_step / 1e3
    wait = between / step if step else 0.0
    if wait >= LOADER_BOUND:
        kind = f"loader-bound: {wait * 100:.0f} % of each step waits for data"
    elif busy_ms is not None and busy_ms >= inside:
        kind = f"GPU-bound: the busiest GPU works {busy_ms:.1f} ms of each {step:.1f} ms step"
    else:
        kind = f"host-bound: {inside:.1f} ms of each {step:.1f} ms step is inside the step range"
    return {"bound_s": bound, "per_step_ms": per_step, "gpu_busy_ms_per_step": busy_ms, "wait_share": wait,
            "line": f"{kind}; with a loader that keeps up, the epoch takes at least {bound:.3g} s "
                    f"({steps} steps x {per_step:.1f} ms)"}


def write_cells_lab(cells: list[tuple[str, int, Path]], out: Path) -> Path | None:
    """The lab page of a comparison (handler.compare): (label, process count, report) per profiled
    cell that finished; the report's .sqlite export stands in where only it is left. A cell
    whose report cannot be read leaves the page unwritten, and says why in one line."""
    entries = []
    for label, count, report in cells:
        found = report if report.is_file() else report.with_suffix(".sqlite")
        if found.is_file():
            entries.append({"report": found, "mode": label, "gpus": count})
    if not entries:
        return None
    try:
        write_lab(entries, out)
    except UserError as err:
        print(f"compare: no lab page: {err}", flush=True)
        return None
    return out / "lab.md"


def write_lab(entries: list[dict], out: Path, convention=None) -> str:
    """Writes out/lab.md, out/lab.json and the figures; returns the page."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for entry in entries:
        trace = load_trace(sqlite_export(entry["report"], out / "exports"), convention)
        summary = summarize(trace)
        gpus = entry["gpus"] or len(summary["gpus"] or ()) or len(summary["ranks"])
        name = f"{entry['mode']}_{gpus}gpu"
        figure = draw(trace, out / f"{name}.png", f"{entry['mode']}, {gpus} GPU(s)")
        rows.append({"report": str(entry["report"]), "mode": entry["mode"], "gpus": gpus, "name": name,
                     "convention": summary["convention"], "epoch_s": summary["overall"]["epoch_mean_s"],
                     "ranks": [{"rank": r["rank"], "loop": r["loop"], "setup": r["setup"],
                                "nccl_ranges": r["nccl_ranges"]} for r in summary["ranks"]],
                     "gpu_table": summary["gpus"], "verdict": verdict(summary), "figure": figure})
    for row in rows:
        base = min((r for r in rows if r["mode"] == row["mode"] and r["epoch_s"]), key=lambda r: r["gpus"], default=None)
        row["speedup"] = base["epoch_s"] / row["epoch_s"] if base and row["epoch_s"] else None
        row["speedup_over_gpus"] = base["gpus"] if base else None
    rows.sort(key=lambda r: (r["mode"], r["gpus"]))
    (out / "lab.json").write_text(json.dumps({"schema": 1, "bound_rule": BOUND_RULE, "reports": rows}, indent=2))
    page = "\n".join(_page(rows) + lab_section(rows))
    (out / "lab.md").write_text(page)
    return page


def _num(x, digits=2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{x * 100:.1f} %"


def _page(rows: list[dict]) -> list[str]:
    modes, counts = sorted({r["mode"] for r in rows}), sorted({r["gpus"] for r in rows})
    cell = {(r["mode"], r["gpus"]): r for r in rows}
    lines = ["# Lab profiles", "", "## Epoch time and speed-up", "",
             "Epoch time in s (speed-up over the same mode on its fewest GPUs).", "",
             "| mode | " + " | ".join(f"{n} GPU" for n in counts) + " |", "|---" * (len(counts) + 1) + "|"]
    for mode in modes:
        lines.append(f"| {mode} | " + " | ".join(
            f"{_num(c['epoch_s'])} ({_num(c['speedup'])}x)" if (c := cell.get((mode, n))) else "" for n in counts) + " |")
    lines += ["", "## Verdicts", "", BOUND_RULE, ""]
    lines += [f"- **{r['mode']}, {r['gpus']} GPU**: {r['verdict']['line']}." for r in rows]
    metric_keys = sorted({k for r in rows for g in r["gpu_table"] or () for k in (g["metrics"] or {})})
    lines += ["", "## Per GPU", "", "Busy shares are of the epochs' length; metrics are means inside the epochs.", "",
              "| " + " | ".join(["report", "GPU", "kernel busy", "compute busy", "NCCL kernel s", "peak MB", *metric_keys])
              + " |",
              "|---" * (6 + len(metric_keys)) + "|"]
    for r in rows:
        for g in r["gpu_table"] or ():
            lines.append("| " + " | ".join([r["name"], str(g["device"]), _pct(g["kernel_busy_share"]),
                                             _pct(g["compute_busy_share"]), _num(g["nccl_kernel_s"], 3),
                                             _num(g["peak_memory_mb"], 0),
                                             *(_num((g["metrics"] or {}).get(k), 1) for k in metric_keys)]) + " |")
    lines += ["", "## Copies (memcpy inside the epochs)", "", "| report | GPU | kind | count | MB | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        for g in r["gpu_table"] or ():
            for kind, c in g["memcpy"].items():
                lines.append(f"| {r['name']} | {g['device']} | {kind} | {c['count']} | {_num(c['mb'], 1)} | "
                             f"{_num(c['seconds'], 4)} |")
    lines += ["", "## Figures", "", "| " + " | ".join(r["name"] for r in rows) + " |", "|---" * len(rows) + "|",
              "| " + " | ".join(f"![{r['name']}]({Path(r['figure']['file']).name})" for r in rows) + " |", ""]
    return lines
