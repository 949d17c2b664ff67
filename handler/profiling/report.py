"""Summarise an Nsight Systems report of a training run, per rank.

    python -m handler.profiling.report nsight_logs/ddp_gpu2.nsys-rep [--out DIR] [--metrics PATH] [--brief]

Writes <report-stem>.summary.md and .summary.json next to the report (or into --out),
prints the markdown (only the one-line summary with --brief). docs/PROFILING.md explains
how to read it.
"""
import argparse
import json
from pathlib import Path

from handler.runtime.errors import UserError, one_line_errors

from .analysis import summarize
from .nsys import nsys_version, sqlite_export
from .render import markdown, one_line
from .trace import load_trace


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m handler.profiling.report", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("report", type=Path, help=".nsys-rep from nsys profile (or its .sqlite export)")
    parser.add_argument("--out", type=Path,
                        help="folder for the summary and the SQLite export (default: next to the report)")
    parser.add_argument("--metrics", type=Path, help="the run's metrics JSON, to compare epoch times")
    parser.add_argument("--brief", action="store_true", help="print only the one-line summary")
    return parser.parse_args(argv)


def load_metrics(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"metrics file {path} does not exist; pass the JSON the run wrote with --metrics") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"metrics file {path} is not JSON ({err}); pass the run's metrics JSON") from None


def main(argv=None) -> None:
    args = parse_args(argv)
    out_dir = args.out or args.report.parent
    metrics = load_metrics(args.metrics) if args.metrics else None
    analysis = summarize(load_trace(sqlite_export(args.report, out_dir)), metrics)
    summary = {"report": str(args.report), "nsys_export_version": nsys_version(),
               "one_line": one_line(analysis), **analysis}
    page = markdown(summary, args.report.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{args.report.stem}.summary.md").write_text(page)
    (out_dir / f"{args.report.stem}.summary.json").write_text(json.dumps(summary, indent=2))
    print(summary["one_line"] if args.brief else page, flush=True)


if __name__ == "__main__":
    with one_line_errors("report"):
        main()
