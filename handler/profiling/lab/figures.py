"""The lab's pictures, drawn for the user: the step timeline and, under it, GPU-metric lanes over a few steady steps.

On top the steps and phases of every rank as bands; under them, per sampled GPU, three lanes:
SM Active, DRAM (read and write, or bandwidth) and PCIe (TX and RX together: DP's lone TX tail on
GPU 0, DDP's TX and RX at once, what students screenshot from the Nsight GUI). Without GPU metrics
the figure holds the bands alone. The values come from the one pass over the export's samples
(gpu_metrics.summary.window_samples). The returned dict, stored in lab.json, lists what was drawn,
read back from the figure itself.
"""
# pyright: reportUnknownMemberType=false
# (matplotlib's own annotations leave its methods' **kwargs untyped; everything of ours here is typed)
from typing import TYPE_CHECKING, Any
from pathlib import Path

import numpy as np

from handler.runtime.names import BATCH, PHASES, RANK

from ..gpu_metrics import KEYS
from ..gpu_metrics.read import Chunk
from ..gpu_metrics.summary import STEADY_STEPS, figure_window as window, window_samples
from ..trace import Trace

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LANES = (("SM Active", ("sm_active_pct",)),
         ("DRAM", ("dram_read_pct", "dram_write_pct", "dram_bw_pct", "dram_read_mbps", "dram_write_mbps",
                   "dram_bw_mbps")),
         ("PCIe", ("pcie_tx_pct", "pcie_rx_pct", "pcie_tx_mbps", "pcie_rx_mbps")))
SERIES = tuple(k for _, keys in LANES for k in keys)
COLOURS = dict(zip(PHASES, ("#bbbbbb", "#9467bd", "#1f77b4", "#ff7f0e", "#2ca02c")))
NONE = Chunk(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0))
__all__ = ["STEADY_STEPS", "draw", "window"]


def draw(trace: Trace, path: Path, title: str) -> dict[str, Any]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = window(trace)
    samples = (window_samples(trace) if span else None) or NONE
    picked = np.isin(samples.key, np.array([KEYS.index(k) for k in SERIES]))
    gpus = sorted(set(samples.gpu[picked].tolist()))
    lanes = [(gpu, name, [k for k in keys if ((samples.gpu == gpu) & (samples.key == KEYS.index(k))).any()])
             for gpu in gpus for name, keys in LANES]
    lanes = [lane for lane in lanes if lane[2]]
    fig, axes = plt.subplots(len(lanes) + 1, 1, figsize=(9, 1.2 + 0.3 * len(trace.processes) + 1.1 * len(lanes)),
                             sharex=True, squeeze=False)
    t0 = span[0] if span else 0
    bands = _bands(axes[0, 0], trace, span, t0)
    drawn: list[dict[str, Any]] = []
    panels: dict[int, list[str]] = {}
    for ax, (gpu, name, keys) in zip(axes[1:, 0], lanes):
        for key in keys:
            pick = (samples.gpu == gpu) & (samples.key == KEYS.index(key))
            order = np.argsort(samples.time[pick], kind="stable")
            ax.plot((samples.time[pick][order] - t0) / 1e6, samples.value[pick][order], label=key, linewidth=0.8)
        ax.set_ylabel(f"GPU {gpu}\n{name}", fontsize=7)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        series = [str(line.get_label()) for line in ax.get_lines()]
        drawn.append({"gpu": gpu, "lane": name, "series": series})
        panels.setdefault(gpu, []).extend(series)
    axes[-1, 0].set_xlabel("ms from the window's start")
    drawn_title = fig.suptitle(title + ("" if lanes else " (no GPU metrics: phase bands only)"), fontsize=9).get_text()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"file": str(path), "title": drawn_title, "window_ns": list(span) if span else None,
            "panels": [{"gpu": g, "series": s} for g, s in panels.items()], "lanes": drawn, "bands": bands}


def _bands(ax: "Axes", trace: Trace, span: tuple[int, int] | None, t0: int) -> list[dict[str, Any]]:
    """Per rank, its steps (thin, above) and phases (below) inside the window."""
    drawn: list[dict[str, Any]] = []
    for row, process in enumerate(trace.processes):
        inside = [r for r in process.ranges if span and r.end > span[0] and r.start < span[1]]
        steps = [(r.start, r.end) for r in inside if BATCH.match(r.name)]
        ax.broken_barh([((a - t0) / 1e6, (b - a) / 1e6) for a, b in steps], (row + 0.6, 0.3), facecolors="#444444")
        names: list[str] = []
        for phase in PHASES:
            bars = [((r.start - t0) / 1e6, r.seconds * 1e3) for r in inside if r.name == phase]
            if bars:
                ax.broken_barh(bars, (row + 0.1, 0.45), facecolors=COLOURS[phase], label=phase if row == 0 else None)
                names.append(phase)
        drawn.append({"rank": process.rank, "steps": len(steps), "phases": names})
    ax.set_yticks([row + 0.5 for row in range(len(trace.processes))], [RANK(p.rank) for p in trace.processes])
    if any(d["phases"] for d in drawn):
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return drawn
