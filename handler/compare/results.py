"""The numbers a comparison reports, derived from each cell's metrics and profile summary.

Epoch time is the measured epoch (handler/profiling/scaling/epochs.py, the one definition the
lab page and the what-if use too): the median of the epochs after the first (the first pays for
start-up: allocator growth, worker start, DALI prefetch), or the only epoch when there is one;
from the nsys epoch ranges of a profiled cell (as its lab page reads them), else the metrics
JSON's epoch timer. images/s is the metrics' median over the epochs after the first. Speed-up
is against the same variant's smallest count that finished.
"""
import math
import dataclasses
from dataclasses import dataclass
from statistics import median
from typing import Optional

from ..profiling.analysis import GPU_PHASES
from ..profiling.record.metrics import MetricsEpoch
from ..profiling.record.summary import Summary
from ..profiling.scaling.epochs import Measured, of_metrics, of_summary
from ..runtime.names import DATA, PHASES
from .provenance import dataset_identity
from .runner import Outcome

SHARES = (*GPU_PHASES, "other")  # data_gpu: the input pipeline's own GPU work (DALI, nvJPEG)


@dataclass
class Row:
    name: str
    label: str
    mode: str
    count: int
    options: str
    status: str
    exit_code: Optional[int]
    error: str
    folder: str
    command: str
    epochs_timed: int = 0
    epoch_s: Optional[float] = None  # the measured epoch (epochs.py)
    epoch_from: str = ""  # "nsys epoch ranges" (profiled) or "metrics epoch timer"
    epochs_used: Optional[list[int]] = None  # the epoch numbers the measured epoch is the median of
    epoch_spread: Optional[float] = None  # (slowest - fastest) / median over them
    epoch_noisy: bool = False  # spread above epochs.NOISY_SHARE
    measured: Optional[Measured] = None  # epochs.of_*'s whole answer, for the pages
    images_per_s: Optional[float] = None
    data_wait_share: Optional[float] = None
    test_acc: Optional[float] = None
    speedup: Optional[float] = None
    ideal: Optional[float] = None
    efficiency: Optional[float] = None
    phases: Optional[dict[str, float]] = None  # share of training time per phase
    phase_source: str = ""  # "nsys", "nsys GPU time" (GPU runs), or "loop timers" from epochs[].phase_s
    gpu_metrics: Optional[dict[str, float]] = None  # metric key -> mean over the cell's GPUs of the in-epoch mean
    measured_epoch_s: Optional[float] = None  # epoch_s, beside the prediction (handler/compare/predict.py)
    predicted_epoch_s: Optional[float] = None  # from the variant's cell with the fewest processes
    prediction_error: Optional[float] = None  # (predicted - measured) / measured
    predicted_bound: str = ""  # the resource the model says bounds this cell
    predicted_from: str = ""  # the cell the prediction was made from
    predicted_base: str = ""  # the base's measured epoch, its epochs and spread (epochs.line)
    predicted_could_move: Optional[list[float]] = None  # [low, high] s where the base's epochs are noisy

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def build_rows(outcomes: list[Outcome]) -> list[Row]:
    rows = [_row(o) for o in outcomes]
    _add_speedups(rows)
    return rows


def _row(outcome: Outcome) -> Row:
    cell = outcome.cell
    row = Row(name=cell.name, label=cell.variant.label, mode=cell.variant.mode, count=cell.count,
              options=" ".join(cell.variant.args), status=outcome.status, exit_code=outcome.exit_code,
              error=outcome.error, folder=outcome.folder, command=outcome.command)
    if outcome.status != "ok" or outcome.metrics is None:
        return row
    epochs = outcome.metrics.epochs
    steady = epochs[1:] or epochs
    measured_epoch(row, outcome)
    row.epochs_timed = len(row.epochs_used or ())
    rates = [e.images_per_s for e in steady if e.images_per_s is not None]
    row.images_per_s = median(rates) if rates else None
    timed = sum(e.time_s or 0.0 for e in steady)
    row.data_wait_share = sum(e.data_wait_s or 0.0 for e in steady) / timed if timed else None
    row.test_acc = outcome.metrics.test.acc if outcome.metrics.test else None
    row.phases, row.phase_source = nsys_shares(outcome.profile)
    row.gpu_metrics = gpu_metric_means(outcome.profile)
    if row.phases is None and all(e.phase_s is not None for e in steady):
        row.phases, row.phase_source = timer_shares(steady), "loop timers"
    return row


def measured_epoch(row: Row, outcome: Outcome) -> None:
    """The cell's measured epoch: from its profile's epoch ranges where it was profiled (what its lab
    page reads), else from its metrics' epoch timer; one rule either way (epochs.py)."""
    found = of_summary(outcome.profile) if outcome.profile else None
    row.epoch_from = "nsys epoch ranges"
    if not found or found["s"] is None:
        found, row.epoch_from = of_metrics(outcome.metrics), "metrics epoch timer"
    row.measured, row.epoch_s, row.epochs_used = found, found["s"], found["epochs"]
    row.epoch_spread, row.epoch_noisy = found["spread"], found["noisy"]


def nsys_shares(summary: Optional[Summary]) -> tuple[Optional[dict[str, float]], str]:
    """(shares, source). CPU runs: shares of batch time per phase from the NVTX ranges.
    GPU runs: the GPU-side view, shares of the GPUs' training time spent on work each phase
    launched, with `data` the GPU idle while the CPU waits for data (docs/PROFILING.md)."""
    if not summary:
        return None, ""
    overall = summary.overall
    if overall.gpu_phase_shares:
        shares = {p: overall.gpu_phase_shares.get(p) or 0.0 for p in GPU_PHASES}
        shares[DATA] = overall.gpu_data_stall_share or 0.0
        source = "nsys GPU time"
    else:
        shares, source = {p: overall.phase_shares.get(p) or 0.0 for p in PHASES}, "nsys"
    found = _with_other(shares)
    return found, source if found else ""


def gpu_metric_means(summary: Optional[Summary]) -> Optional[dict[str, float]]:
    """Each GPU metric's in-epoch mean, averaged over the cell's GPUs (every rank's)."""
    values: dict[str, list[float]] = {}
    for rank in summary.ranks if summary else ():
        for device in (rank.gpu_metrics or {}).values():
            for key, stat in device.items():
                if stat.mean is not None:
                    values.setdefault(key, []).append(stat.mean)
    return {key: sum(v) / len(v) for key, v in values.items()} or None


def timer_shares(epochs: list[MetricsEpoch]) -> Optional[dict[str, float]]:
    """Shares of epoch time per phase from the loop's own timers (epochs[].phase_s)."""
    total = sum(e.time_s or 0.0 for e in epochs)
    if not total:
        return None
    return _with_other({p: sum((e.phase_s or {}).get(p, 0.0) for e in epochs) / total for p in PHASES})


def _with_other(shares: dict[str, float]) -> Optional[dict[str, float]]:
    """What no phase covers is `other`; all zero means no phase was recorded."""
    if not any(shares.values()):
        return None
    return {**{p: 0.0 for p in GPU_PHASES}, **shares, "other": max(0.0, 1.0 - sum(shares.values()))}


def _add_speedups(rows: list[Row]) -> None:
    for label in {r.label for r in rows}:
        done = sorted((r for r in rows if r.label == label and r.epoch_s), key=lambda r: r.count)
        if not done:
            continue
        base = done[0].epoch_s or 1.0
        for r in done:
            speedup = base / (r.epoch_s or base)
            r.speedup = speedup if math.isfinite(speedup) else None  # an epoch too short to divide by: no ratio
            r.ideal = r.count / done[0].count
            r.efficiency = r.speedup / r.ideal if r.speedup is not None else None


def dataset_description(outcomes: list[Outcome]) -> str:
    """What the finished cells trained on, from their metrics (env.dataset and config)."""
    seen: list[str] = []
    for o in outcomes:
        if not o.metrics:
            continue
        cfg = o.metrics.config.model_extra or {}
        name = o.metrics.env.dataset or str(cfg.get("dataset") or "unknown")
        if name == "synthetic":
            name = (f"synthetic (generated, {cfg.get('synthetic_train')} train / "
                    f"{cfg.get('synthetic_test')} test images; NOT CIFAR-10)")
        elif name == "cifar10":
            name = f"cifar10: {dataset_identity(cfg.get('data'))}"
        if name not in seen:
            seen.append(name)
    return "; ".join(seen) or "unknown (no cell wrote metrics)"


def recipe(outcomes: list[Outcome]) -> dict[str, object]:
    """model, epochs, global batch, ... of the first cell that wrote metrics."""
    for o in outcomes:
        if o.metrics:
            cfg = o.metrics.config.model_dump()
            return {k: cfg.get(k) for k in ("model", "epochs", "batch_size", "workers", "valid_size")}
    return {}
