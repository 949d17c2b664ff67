"""Which cell of the lab page (mode and count) each report belongs to (docs/PROFILING.md, "The lab page").

The kit's layout (<mode>_<time>/gpu_<N>) names the cell where a report is in one; elsewhere the
run's metrics JSON beside the report, then the file name. page.py fills in a missing count from
what ran.
"""
import re
from pathlib import Path
from typing import Any

from handler.runtime.errors import UserError

from ..record.metrics import Metrics
from .metrics_file import read_metrics
from ..nsys import no_reports, reports_in

KIT_FOLDER = re.compile(r"(?P<mode>[a-z][a-z_]*?)_\d")  # dp_20251001_173345, ddp_dali_20251001_...
KIT_FILE = re.compile(r"gpu_?(?P<gpus>\d+)", re.I)
FLAT_NAME = re.compile(r"(?P<mode>ddp_dali|ddp|dp|fsdp|pp)\b|(?P<mode2>ddp_dali|ddp|dp|fsdp|pp)_", re.I)
GPUS_IN_NAME = re.compile(r"(?:gpu_?(?P<a>\d+)|(?P<b>\d+)_?gpus?)", re.I)


def is_kit_layout(path: Path) -> bool:
    """A folder of <mode>_<time>/ folders holding gpu_<N> reports."""
    return path.is_dir() and any(sub.is_dir() and KIT_FOLDER.match(sub.name) and reports_in(sub)
                                 for sub in path.iterdir())


def lab_reports(paths: list[Path]) -> list[dict[str, Any]]:
    """[{"report", "mode", "gpus"}] for the reports named, the kit's folders opened."""
    reports: list[Path] = []
    for path in paths:
        if is_kit_layout(path):
            reports += [r for sub in sorted(s for s in path.iterdir() if s.is_dir() and KIT_FOLDER.match(s.name))
                        for r in reports_in(sub)]
        else:
            reports += reports_in(path) if path.is_dir() else [path]
    if not reports:
        fix = "pass the kit's nsight_logs folder or the reports themselves"
        if len(paths) == 1 and paths[0].is_dir():
            raise UserError(no_reports(paths[0], fix))
        raise UserError(f"no .nsys-rep or .sqlite report in {', '.join(map(str, paths))}; {fix}")
    return [_cell_of(report) for report in reports]


def _cell_of(report: Path) -> dict[str, Any]:
    """The kit's layout names the cell (the run asked for gpu_<N>, whatever ran); elsewhere the
    run's metrics JSON, then the file name."""
    folder, count = KIT_FOLDER.match(report.parent.name), KIT_FILE.fullmatch(report.stem)
    if folder and count:
        return {"report": report, "mode": folder.group("mode"), "gpus": int(count.group("gpus")),
                "model": _from_metrics(report).get("model")}
    mode = FLAT_NAME.search(report.stem)
    count = GPUS_IN_NAME.search(report.stem)
    return {"report": report, "mode": (mode.group("mode") or mode.group("mode2")).lower() if mode else report.stem,
            "gpus": int(count.group("a") or count.group("b")) if count else None, **_from_metrics(report)}


def _from_metrics(report: Path) -> dict[str, str | int]:
    """{"mode", "gpus", "model"} from the run's metrics JSON beside the report (`<name>.metrics.json`,
    scripts/launch.sh writes it there), which knows them exactly; {} without a readable one."""
    metrics = metrics_beside(report)
    if metrics is None:
        return {}
    found = {"mode": metrics.config.mode, "gpus": metrics.config.num_gpu, "model": metrics.config.model}
    return {k: v for k, v in found.items() if v}


def metrics_beside(report: Path, strict: bool = False) -> Metrics | None:
    """The run's metrics JSON beside its report, parsed; None without one. One that cannot be used (damaged,
    another file's JSON): None for the cell, which then comes from the file name; with strict, UserError
    naming it (page.py leaves that report off the page, saying why)."""
    path = report.with_name(report.name.split(".")[0] + ".metrics.json")
    if not path.exists():
        return None
    try:
        return read_metrics(path, f"it lies beside {report.name} as its run's metrics: fix it, or move it away "
                                  "to read the report without it")
    except UserError:
        if strict:
            raise
        return None
