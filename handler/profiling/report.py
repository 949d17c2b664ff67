"""Summarise an Nsight Systems report of a training run, per rank (and per host for a job of several).

    python -m handler.profiling.report nsight_logs/ddp_gpu2.nsys-rep [--out DIR] [--metrics PATH] [--brief]
    python -m handler.profiling.report nsight_logs/1234_node1.nsys-rep nsight_logs/1234_node2.nsys-rep
    python -m handler.profiling.report nsight_logs/job1234/          (every report in the folder)

Writes <report-stem>.summary.md and .summary.json next to the report (or into --out),
prints the markdown (only the one-line summary with --brief). Several reports (one per node,
scripts/slurm/train.sbatch with PROFILE=1) give one summary of the job, <job>.summary.md:
every rank with its host, per-host numbers, stragglers across hosts (handler/profiling/merge.py).
docs/PROFILING.md explains how to read it.
"""
import argparse
import json
import os
from pathlib import Path

from handler.runtime.errors import OneLineParser, UserError, one_line_errors, shown
from handler.runtime.names import EPOCH
from handler.runtime.out_folder import check_out_folder

from .analysis import incomplete, summarize
from .scaling.epochs import contract, of_written
from .scaling.machine import machine_of
from .merge import markdown_lines as merge_lines
from .merge import merge
from .lab.metrics_file import read_metrics
from .record.parse import parse_summary
from .conventions import from_mapping
from .lab.cells import is_kit_layout, lab_reports
from .lab.page import build_lab, say_left_off
from .nsys import no_reports, nsys_version, open_with, recorded_version, reports_in, sqlite_export
from .render import markdown, one_line
from .trace import load_trace


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m handler.profiling.report", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("report", type=Path, nargs="+",
                        help=".nsys-rep from nsys profile (or its .sqlite export); several, or a folder of them, "
                             "for one summary of a job profiled per node")
    parser.add_argument("--out", type=Path,
                        help="folder for the summary and the SQLite export (default: next to the report)")
    parser.add_argument("--metrics", type=Path, help="the run's metrics JSON, to compare epoch times")
    parser.add_argument("--brief", action="store_true", help="print only the one-line summary")
    parser.add_argument("--ranges", nargs="+", metavar="KEY=PATTERN",
                        help="how the profile names its ranges, when neither ours, the lab kit's nor "
                             "torch.profiler's: epoch='Epoch *' step='Batch *' h2d='upload data to GPU' ... "
                             "(docs/PROFILING.md, \"Naming conventions\")")
    parser.add_argument("--lab", action="store_true",
                        help="write the lab page (lab.md, lab.json, figures) over the reports, one per mode and "
                             "GPU count; a folder in the kit's layout (<mode>_<time>/gpu_<N>.nsys-rep) gets it anyway")
    return parser.parse_args(argv)


def load_metrics(path: Path) -> dict:
    """The run's metrics JSON, parsed (record/metrics.py: an odd field is named, with its path, before any
    summary is written), as the data the analysis reads: what the file gave, no field added."""
    return read_metrics(path).model_dump(by_alias=True, exclude_unset=True)


def reports_of(paths: list[Path]) -> list[Path]:
    """The reports named, a folder standing for its reports (nsys.reports_in)."""
    found = []
    for path in paths:
        if path.is_dir():
            inside = reports_in(path)
            if not inside:
                raise UserError(no_reports(path, "pass a folder of nsys reports"))
            found += inside
        else:
            found.append(path)
    return found


def _folder(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def job_name(reports: list[Path]) -> str:
    """`1234` for 1234_node1 and 1234_node2 (train.sbatch's names); else the stems' common prefix, or `job`."""
    stems = [r.stem for r in reports]
    heads = {s.split("_", 1)[0] for s in stems}
    if len(heads) == 1 and all("_" in s for s in stems):
        return heads.pop()
    return os.path.commonprefix(stems).rstrip("_-.") or "job"


def capture_window(ranks: list[dict], metrics: dict | None) -> dict:
    """The epochs this report covers (a capture window, docs/PROFILING.md, may leave some out),
    how many the run trained, and the metrics JSON's time for each epoch outside the report."""
    covered = sorted(set().union(*({e["epoch"] for e in r["epochs"]} for r in ranks)))
    trained = [(entry.get("epoch", i), entry.get("time_s")) for i, entry in enumerate((metrics or {}).get("epochs") or [])]
    return {"epochs": covered, "run_epochs": len(trained) if metrics else None,
            "outside": [{"epoch": e, "metrics_s": t} for e, t in trained if e not in covered]}


def main(argv=None) -> None:
    args = parse_args(argv)
    convention = from_mapping(args.ranges) if args.ranges else None
    if args.out:  # before any export or page: nothing is written anywhere when it cannot be
        check_out_folder(args.out, "--out")
    if args.lab or any(is_kit_layout(p) for p in args.report):
        if args.metrics:  # not taken in silence: each report's own metrics are beside it
            raise UserError("--metrics is for one report or one job; the lab page reads each report's metrics JSON "
                            "beside it (<name>.metrics.json, as launch.sh writes it): drop --metrics")
        entries, out = lab_reports(args.report), args.out or _folder(args.report[0])
        check_out_folder(out, "the lab page's folder (no --out given)", "pass --out DIR, a folder you can write")
        page, left_off = build_lab(entries, out, convention)
        print(shown(page), flush=True)
        say_left_off(left_off, len(entries), out)  # after the page, so that a terminal ends on them
        return
    reports = reports_of(args.report)
    out_dir = args.out or reports[0].parent
    check_out_folder(out_dir, "the report's folder (no --out given)", "pass --out DIR, a folder you can write")
    metrics = load_metrics(args.metrics) if args.metrics else None
    if len(reports) == 1:
        export = sqlite_export(reports[0], out_dir)
        trace = load_trace(export, convention)
        analysis = summarize(trace, metrics, report=reports[0])
        analysis["machine"] = machine_of(export, analysis["ranks"], metrics, trace.processes)
        analysis["capture_window"] = capture_window(analysis["ranks"], metrics)
        analysis["measured_epoch"] = contract(of_written(analysis))  # the window says which epoch warmed up
        name, title, extra = reports[0].stem, reports[0].name, []
        recorded = recorded_version(reports[0])
        summary = {"report": str(reports[0]), "nsys_export_version": nsys_version(),
                   "recorded_by_nsys": recorded, "open_with": open_with(recorded),
                   "one_line": one_line(analysis), **analysis}
    else:
        analysis = merge([(r.name, sqlite_export(r, out_dir)) for r in reports], metrics)
        analysis["incomplete"] = incomplete(analysis["ranks"])
        analysis["capture_window"] = capture_window(analysis["ranks"], metrics)
        analysis["measured_epoch"] = contract(of_written(analysis))  # as summarize's (scaling/epochs.py)
        name = job_name(reports)
        title, extra = f"job {name} ({len(reports)} reports)", merge_lines(analysis)
        summary = {"report": [str(r) for r in reports], "nsys_export_version": nsys_version(),
                   "one_line": one_line(analysis), **analysis}
    if summary["incomplete"]:
        summary["one_line"] += (f"; cut short inside {EPOCH(summary['incomplete']['epoch'])} "
                                f"(complete epochs counted: {summary['incomplete']['complete_epochs']})")
    page = markdown(summary, title) + ("\n" + "\n".join(extra) if extra else "")  # shown: a name not UTF-8
    for note in ([f"Recorded by nsys {summary['recorded_by_nsys']}; {summary['open_with']}."] if summary.get("open_with")
                 else []) + ([f"Cut short: {summary['incomplete']['line']}."] if summary["incomplete"] else []):
        head, _, rest = page.partition("\n\n")
        page = f"{head}\n\n{note}\n\n{rest}"
    record = parse_summary(summary, f"the summary of {title}", "the report built a summary that breaks its contract "
                           "(docs/summary.schema.json): report it, with the report, as a bug")
    out_dir.mkdir(parents=True, exist_ok=True)
    page = shown(page)
    (out_dir / f"{name}.summary.md").write_text(page)
    (out_dir / f"{name}.summary.json").write_text(json.dumps(record.model_dump(mode="json", by_alias=True), indent=2))
    print(summary["one_line"] if args.brief else page, flush=True)


if __name__ == "__main__":
    with one_line_errors("report"):
        main()
