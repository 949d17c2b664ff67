"""Each cell's epoch predicted from its variant's profiled cell with the fewest processes, beside the
measured one: the what-if model (handler/profiling/whatif.py) checked by the matrix.

One path with the comparison's lab page: each profiled cell's summary JSON becomes the lab page's
row (lab/page.py summary_row) and the predictions are the lab page's (lab/whatif_folder.py):
the same base, link, CPU factors and measured epoch (scaling/epochs.py), so report.md and
lab/lab.md print the same numbers cell by cell. Where the base's measured epoch is noisy, each
prediction carries how far it could move (epochs.could_move).
"""
from statistics import median

from ..profiling.lab.page import LabRow, summary_row
from ..profiling.record.metrics import Metrics
from ..profiling.scaling.epochs import could_move, line as epoch_line
from ..profiling.lab.whatif_folder import folder_predictions
from ..profiling.whatif import ASSUMPTIONS, COUNTS
from ..profiling.whatif import gradient_mb as whatif_gradient_mb
from .results import Row
from .runner import Outcome


def gradient_mb(metrics: Metrics | None) -> float:
    """MB of fp32 gradients the run all-reduces per step: its model's (whatif.GRAD_MB)."""
    return whatif_gradient_mb(metrics.config.model if metrics else None)


def lab_rows(rows: list[Row], outcomes: list[Outcome]) -> list[LabRow]:
    """The lab page's rows of the finished cells that were profiled, from their parsed summary JSONs."""
    by_name = {o.cell.name: o for o in outcomes}
    out: list[LabRow] = []
    for row in rows:
        outcome = by_name[row.name]
        if row.status != "ok" or not outcome.profile:
            continue
        report = outcome.profile.report
        entry = {"report": (report if isinstance(report, str) else None) or row.folder, "mode": row.label,
                 "gpus": row.count, "model": outcome.metrics.config.model if outcome.metrics else None}
        out.append(summary_row(outcome.profile, entry, outcome.metrics))
    return out


def add_predictions(rows: list[Row], outcomes: list[Outcome]) -> None:
    """Sets measured_epoch_s on every finished row, and predicted_epoch_s, prediction_error
    (signed, over the measured), predicted_bound, predicted_from and, from a noisy base,
    predicted_could_move on every other count of a variant with a profiled cell. A CPU variant's cores
    are shared by its own recorded CPU time (scaling/cores.py); a profile without it takes its compute
    at other counts from the other variants' profiles of this machine (one rank per process)."""
    for row in rows:
        row.measured_epoch_s = row.epoch_s
    problem, by_label = folder_predictions(lab_rows(rows, outcomes), (*COUNTS, *(r.count for r in rows)))
    if problem:  # the machine could not be read from the profiles: every cell says so, none is predicted
        for row in rows:
            row.predicted_from = f"no prediction ({problem})" if row.epoch_s else ""
        return
    for label, got in by_label.items():
        base = got["base"]
        name = f"{label} x{base['gpus']}"
        others = [r for r in rows if r.label == label and r.epoch_s and r.count != base["gpus"]]
        if got["found"] is None:
            for row in others:
                row.predicted_from = f"{name}: no prediction ({got['why']})"
            continue
        cells = {c["count"]: c for c in got["found"]["cells"]}
        measured = got["found"]["split"].measured or {}
        for row in others:
            cell = cells[row.count]
            row.predicted_epoch_s = predicted = cell["epoch_s"]
            seen = row.epoch_s or predicted
            row.prediction_error = (predicted - seen) / seen
            row.predicted_bound, row.predicted_from = cell["bound"], name
            row.predicted_base = epoch_line(measured, "its measured epoch") if measured else ""
            if measured.get("noisy"):
                row.predicted_could_move = list(could_move(measured, cell["epoch_s"]))


def median_error(rows: list[Row]) -> float | None:
    errors = [abs(r.prediction_error) for r in rows if r.prediction_error is not None]
    return median(errors) if errors else None


def markdown(rows: list[Row]) -> list[str]:
    """The report's section: predicted and measured epoch side by side, with the error; a noisy base
    gets how far each prediction could move, and its own line."""
    predicted = [r for r in rows if r.predicted_from]
    if not predicted:
        return []
    noisy = any(r.predicted_could_move for r in predicted)
    lines = ["## Predicted from the fewest processes", "",
             "Each cell's epoch predicted from the same variant's profiled cell with the fewest processes "
             "(`python -m handler.profiling.whatif` on its summary JSON, the lab page's what-if), beside the "
             "measured one.", "",
             "| cell | predicted from | predicted epoch s | " + ("could move s | " if noisy else "")
             + "measured epoch s | error | bound |", "|---|---|---|---|---|---|" + ("---|" if noisy else "")]
    for r in predicted:
        move = ([f"{r.predicted_could_move[0]:.2f}-{r.predicted_could_move[1]:.2f}" if r.predicted_could_move else ""]
                if noisy else [])
        seen = f"{r.measured_epoch_s:.2f}" if r.measured_epoch_s is not None else "—"
        if r.predicted_epoch_s is None or r.prediction_error is None:
            lines.append("| " + " | ".join([r.name, r.predicted_from, "—", *move, seen, "—", "—"]) + " |")
            continue
        lines.append("| " + " | ".join([r.name, r.predicted_from, f"{r.predicted_epoch_s:.2f}", *move, seen,
                                        f"{r.prediction_error * 100:+.1f} %", r.predicted_bound]) + " |")
    bases = sorted({(r.predicted_from, r.predicted_base) for r in predicted if r.predicted_base})
    lines += ["", *(f"- {cell}: {base}." for cell, base in bases)] if bases else []
    error = median_error(rows)
    if error is not None:
        count = sum(r.prediction_error is not None for r in rows)
        lines += ["", f"Median absolute error: {error * 100:.1f} % over {count} predicted cells."]
    return [*lines, "", ASSUMPTIONS, ""]
