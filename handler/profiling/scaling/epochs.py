"""A run's epoch time: the one definition every page uses (docs/PROFILING.md, "The measured epoch").

The summary's `measured_epoch` (analysis.py), the lab page's cells, handler.compare's measured
cells and the what-if's base (step.py) all come from `of_times` here. With several
complete epochs the first pays for start-up (allocator growth, worker start, DALI's prefetch) and is
left out; the median of the rest is robust to one disturbed epoch. Where the epochs used spread
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
RULE = ("The measured epoch is the median of the complete epochs after the first (the first, the warm-up, is left "
        "out), or the only one; its spread is (slowest - fastest) / median over the epochs used, and above "
        f"{NOISY_SHARE * 100:.0f} % the epoch is named noisy (handler/profiling/scaling/epochs.py).")


def of_times(times: list[tuple[int, float]]) -> Measured:
    """The measured epoch of (epoch number, seconds) pairs, complete epochs only: {"s", "epochs",
    "spread", "noisy", "rule", "fastest_s", "slowest_s"}; "s" is None without an epoch."""
    timed = sorted((e, s) for e, s in times if s and s > 0)
    used = timed[1:] or timed
    seconds = [s for _, s in used]
    middle = median(seconds) if seconds else None
    spread = (max(seconds) - min(seconds)) / middle if middle else 0.0
    return {"s": middle, "epochs": [e for e, _ in used], "spread": spread, "noisy": spread > NOISY_SHARE,
            "rule": RULE, "fastest_s": min(seconds) if seconds else None, "slowest_s": max(seconds) if seconds else None}


def of_ranks(ranks: list[dict[str, Any]]) -> Measured:
    """The measured epoch of the ranks the report is writing (analysis.py, report.py)."""
    return of_epochs([[(e.get("epoch", i), e.get("time_s") or 0.0) for i, e in enumerate(r.get("epochs") or ())]
                      for r in ranks])


def of_epochs(ranks: list[list[tuple[int, float]]]) -> Measured:
    """The measured epoch of each rank's (epoch, seconds): each epoch as long as its slowest rank (the ranks
    step together), over the epochs every rank with epochs completed."""
    timed = [dict(r) for r in ranks if r]
    common: set[int] = set(timed[0]).intersection(*timed[1:]) if timed else set()
    return of_times([(e, max(t[e] for t in timed)) for e in common])


def of_summary(summary: Summary) -> Measured:
    """A summary's measured epoch, from its ranks' epochs (what analysis.py wrote as `measured_epoch`,
    the same way, so an older summary without the field, or a merged job's, gets it too); the
    written field alone where no rank lists its epochs."""
    found = of_epochs([[(e.epoch, e.time_s) for e in r.epochs] for r in summary.ranks])
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
