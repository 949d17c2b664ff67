"""Each cell's epoch predicted from its variant's cell with the fewest processes, beside the
measured one: the what-if model (handler/profiling/whatif.py) checked by the matrix.

The model splits the base cell's profiled step by resource and scales it to each count; the
ratio of the predicted step to the base's is applied to the base's measured epoch (the
median of its epochs after the first, as every row's), so both columns are measured alike.
"""
from statistics import median

from ..profiling.scaling.scale import cpu_factors
from ..profiling.scaling.step import split_of
from ..profiling.whatif import ASSUMPTIONS, predictions
from ..profiling.whatif import gradient_mb as whatif_gradient_mb
from ..runtime.errors import UserError


def gradient_mb(metrics: dict | None) -> float:
    """MB of fp32 gradients the run all-reduces per step: its model's (whatif.GRAD_MB)."""
    return whatif_gradient_mb(((metrics or {}).get("config") or {}).get("model"))


def add_predictions(rows, outcomes) -> None:
    """Sets measured_epoch_s on every finished row, and predicted_epoch_s, prediction_error
    (signed, over the measured), predicted_bound and predicted_from on every other count of
    a variant whose fewest-process cell was profiled. A CPU variant's cores are shared by its own
    recorded CPU time (scaling/cores.py); a profile without it takes its compute at other counts
    from the other variants' profiles of this machine (one rank per process: not dp, not pp)."""
    by_name = {o.cell.name: o for o in outcomes}
    for row in rows:
        row.measured_epoch_s = row.epoch_s
    splits = _cpu_splits(rows, by_name)
    for label in sorted({r.label for r in rows}):
        done = sorted((r for r in rows if r.label == label and r.epoch_s), key=lambda r: r.count)
        if len(done) < 2 or not by_name[done[0].name].profile:
            continue
        base, outcome = done[0], by_name[done[0].name]
        others = {k: v for k, v in splits.items() if k != label}
        try:
            found = predictions(outcome.profile, [r.count for r in done], grad_mb=gradient_mb(outcome.metrics),
                                mode="dp" if base.mode == "dp" else None, factors=cpu_factors(others, base.count))
        except UserError as err:
            for row in done[1:]:
                row.predicted_from = f"{base.name}: no prediction ({err})"
            continue
        cells = {c["count"]: c for c in found["cells"]}
        split = found["split"]
        own = cells[split.devices if split.gpu else split.processes]
        for row in done[1:]:
            cell = cells[row.count]
            row.predicted_epoch_s = base.epoch_s * cell["epoch_s"] / own["epoch_s"]
            row.prediction_error = (row.predicted_epoch_s - row.epoch_s) / row.epoch_s
            row.predicted_bound, row.predicted_from = cell["bound"], base.name


def _cpu_splits(rows, by_name) -> dict:
    """label -> count -> split, of the profiled CPU cells of variants with a rank per process."""
    out: dict = {}
    for row in rows:
        profile = by_name[row.name].profile
        if not profile or row.mode in ("dp", "pp"):
            continue
        try:
            split = split_of(profile)
        except UserError:
            continue
        if not split.gpu:
            out.setdefault(row.label, {})[row.count] = split
    return out


def median_error(rows) -> float | None:
    errors = [abs(r.prediction_error) for r in rows if r.prediction_error is not None]
    return median(errors) if errors else None


def markdown(rows) -> list[str]:
    """The report's section: predicted and measured epoch side by side, with the error."""
    predicted = [r for r in rows if r.predicted_from]
    if not predicted:
        return []
    lines = ["## Predicted from the fewest processes", "",
             "Each cell's epoch predicted from the same variant's cell with the fewest processes "
             "(`python -m handler.profiling.whatif` on its summary JSON), beside the measured one.", "",
             "| cell | predicted from | predicted epoch s | measured epoch s | error | bound |", "|---|---|---|---|---|---|"]
    for r in predicted:
        if r.predicted_epoch_s is None:
            lines.append(f"| {r.name} | {r.predicted_from} | — | {r.measured_epoch_s:.2f} | — | — |")
            continue
        lines.append(f"| {r.name} | {r.predicted_from} | {r.predicted_epoch_s:.2f} | {r.measured_epoch_s:.2f} | "
                     f"{r.prediction_error * 100:+.1f} % | {r.predicted_bound} |")
    error = median_error(rows)
    if error is not None:
        count = sum(r.prediction_error is not None for r in rows)
        lines += ["", f"Median absolute error: {error * 100:.1f} % over {count} predicted cells."]
    return [*lines, "", ASSUMPTIONS, ""]
