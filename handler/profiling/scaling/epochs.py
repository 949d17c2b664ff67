"""A run's epoch time: the one definition every page uses (docs/PROFILING.md, "The measured epoch").

The summary's `measured_epoch` (analysis.py), the lab page's cells, handler.compare's measured
cells, the head line (render.one_line, launch.sh's last line) and the what-if's base (step.py) all come
from `of_times` here. The run's first epoch, the warm-up, pays for start-up (allocator growth, worker
start, DALI's prefetch) and is left out where the report holds it and another; a capture window that
starts after it (--profile-epochs 1:2) drops nothing. The median of the rest is robust to one disturbed epoch. Where the epochs used spread
more than NOISY_SHARE of that median, the base is named noisy, and how far a prediction made from
it could move is said beside it (`could_move`) instead of one number printed as if it were sure.
"""
from statistics import median
from typing import Any

from handler.runtime.names import EPOCH

from ..record.metrics import Metrics
from ..record.summary import Summary

Measured = dict[str, Any]  # {"s", "epochs", "spread", "noisy", "rule", "fastest_s", "slowest_s"}

NOISY_SHARE = 0.10  # (slowest - fastest) / median of the epochs used, above which a measured epoch is noisy
WARMUP_AT_0 = ("ours", "lab kit", "torch.profiler")  # conventions whose epochs count from 0, as the trainer's
RULE = ("The measured epoch is the median of the complete epochs, the run's first (the warm-up) left out where the "
        "report holds it and another (a capture window after it, --profile-epochs 1:2, keeps every epoch it holds), "
        "or the only one; its spread is (slowest - fastest) / median over the epochs used, and above "
        f"{NOISY_SHARE * 100:.0f} % the epoch is named noisy (handler/profiling/scaling/epochs.py).")


def of_times(times: list[tuple[int, float]], warmup: int | None = None) -> Measured:
    """The measured epoch of (epoch number, seconds) pairs, complete epochs only: {"s", "epochs",
    "spread", "noisy", "rule", "fastest_s", "slowest_s"}; "s" is None without an epoch. warmup: the
    run's first trained epoch, left out when it is the first here; None: the first here is it."""
    timed = sorted((e, s) for e, s in times if s and s > 0)
    used = timed[1:] if len(timed) > 1 and (warmup is None or timed[0][0] <= warmup) else timed
    seconds = [s for _, s in used]
    middle = median(seconds) if seconds else None
    spread = (max(seconds) - min(seconds)) / middle if middle else 0.0
    return {"s": middle, "epochs": [e for e, _ in used], "spread": spread, "noisy": spread > NOISY_SHARE,
            "rule": RULE, "fastest_s": min(seconds) if seconds else None, "slowest_s": max(seconds) if seconds else None}


def of_ranks(ranks: list[dict[str, Any]], warmup: int | None = 0) -> Measured:
    """The measured epoch of the ranks the report is writing (analysis.py, report.py); warmup as of_times'."""
    return of_epochs([[(e.get("epoch", i), e.get("time_s") or 0.0) for i, e in enumerate(r.get("epochs") or ())]
                      for r in ranks], warmup)


def of_epochs(ranks: list[list[tuple[int, float]]], warmup: int | None = 0) -> Measured:
    """The measured epoch of each rank's (epoch, seconds): each epoch as long as its slowest rank (the ranks
    step together), over the epochs every rank with epochs completed; warmup as of_times'."""
    timed = [dict(r) for r in ranks if r]
    common: set[int] = set(timed[0]).intersection(*timed[1:]) if timed else set()
    return of_times([(e, max(t[e] for t in timed)) for e in common], warmup)


def first_trained(held: list[int], outside: list[int], run_epochs: int | None, convention: str | None) -> int | None:
    """The run's warm-up epoch: the lowest epoch its report holds (held) or its metrics JSON names outside it
    (the capture window), where the metrics say how many the run trained; else 0 for the conventions
    numbering from 0; None for a user's --ranges (the first held is taken)."""
    if run_epochs and (held or outside):
        return min([*held, *outside])
    return 0 if (convention or "ours") in WARMUP_AT_0 else None


def of_written(summary: dict[str, Any]) -> Measured:
    """The measured epoch of the summary the report is writing (analysis.py, report.py): its ranks' epochs,
    the warm-up read from its capture window and convention as of_summary reads them."""
    window: dict[str, Any] = summary.get("capture_window") or {}
    outside: list[dict[str, Any]] = window.get("outside") or []
    held: list[int] = window.get("epochs") or []
    run_epochs: int | None = window.get("run_epochs")
    warmup = first_trained(list(held), [int(o["epoch"]) for o in outside], run_epochs, summary.get("convention"))
    return of_ranks(summary.get("ranks") or [], warmup)


def of_summary(summary: Summary) -> Measured:
    """A summary's measured epoch, from its ranks' epochs (what analysis.py wrote as `measured_epoch`,
    the same way, so an older summary without the field, or a merged job's, gets it too); the
    written field alone where no rank lists its epochs."""
    window = summary.capture_window
    warmup = first_trained(list(window.epochs), [o.epoch for o in window.outside], window.run_epochs,
                           summary.convention) if window is not None else first_trained([], [], None, summary.convention)
    found = of_epochs([[(e.epoch, e.time_s) for e in r.epochs] for r in summary.ranks], warmup)
    written = summary.measured_epoch
    if found["s"] is None and written is not None and written.s:
        return {**found, "s": written.s, "epochs": list(written.epochs), "spread": written.spread,
                "noisy": written.noisy, "rule": written.rule or RULE, "fastest_s": written.s, "slowest_s": written.s}
    return found


def contract(found: Measured) -> Measured:
    """The summary's `measured_epoch` field (docs/summary.schema.json): s, epochs, spread, noisy, rule."""
    return {k: found[k] for k in ("s", "epochs", "spread", "noisy", "rule")}


def of_metrics(metrics: Metrics | None) -> Measured:
    """The measured epoch of a metrics JSON's epoch timer (epochs[].time_s, rank 0's clock)."""
    return of_times([(i if e.epoch is None else e.epoch, e.time_s or 0.0)
                     for i, e in enumerate(metrics.epochs if metrics else ())])


def epochs_text(epochs: list[int]) -> str:
    """"epochs 1-3", "epochs 1, 3", "epoch 0"."""
    if not epochs:
        return "no epoch"
    if len(epochs) == 1:
        return EPOCH(epochs[0])
    if epochs[-1] - epochs[0] == len(epochs) - 1 and epochs == sorted(set(epochs)):  # no range built: 1e12 is a count
        return f"epochs {epochs[0]}-{epochs[-1]}"
    return "epochs " + ", ".join(map(str, epochs))


def short(found: Measured) -> str:
    """What a table cell says beside the time: "epochs 1-3, spread 2 %", "..., NOISY"."""
    if found.get("s") is None:
        return "no complete epoch"
    return f"{epochs_text(found['epochs'])}, spread {found['spread'] * 100:.0f} %" + (", NOISY" if found["noisy"] else "")


def could_move(found: Measured, predicted_s: float) -> tuple[float, float]:
    """How far a prediction made from this measured epoch could move: scaled by the fastest and the
    slowest epoch used over their median."""
    s = found.get("s")
    if not s:
        return predicted_s, predicted_s
    return predicted_s * (found.get("fastest_s") or s) / s, predicted_s * (found.get("slowest_s") or s) / s


def line(found: Measured, name: str = "the measured epoch") -> str:
    """One sentence: the time, the epochs used, their spread and, when noisy, that it is."""
    if found.get("s") is None:
        return f"{name}: none (no complete epoch)"
    text = f"{name} {found['s']:.3g} s: the median of {epochs_text(found['epochs'])}, spread {found['spread'] * 100:.0f} %"
    if found["noisy"]:
        text += (f"; NOISY: the epochs used spread more than {NOISY_SHARE * 100:.0f} % (from {found['fastest_s']:.3g} to "
                 f"{found['slowest_s']:.3g} s: another job beside the run, say), so what is predicted from it could "
                 "move as far as they do")
    return text
