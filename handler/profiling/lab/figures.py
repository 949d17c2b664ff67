"""The lab's pictures, drawn for the user: GPU-metric patterns over a few steady steps.

One panel per GPU with SMs active, PCIe TX and RX and DRAM over the window (what students
screenshot from the Nsight GUI: DP's lone TX tail on GPU 0, DDP's TX and RX together), and
under them the steps and phases of every rank as bands. Without GPU metrics the figure holds
the bands alone. The returned dict, stored in lab.json, lists what was drawn, read back from
the figure itself.
"""
from typing import Any
from pathlib import Path

from handler.runtime.names import BATCH, PHASES, RANK

from ..trace import Trace

SERIES = ("sm_active_pct", "pcie_tx_pct", "pcie_rx_pct", "pcie_tx_mbps", "pcie_rx_mbps", "dram_read_pct",
          "dram_write_pct", "dram_bw_pct")
STEADY_STEPS = 4
COLOURS = dict(zip(PHASES, ("#bbbbbb", "#9467bd", "#1f77b4", "#ff7f0e", "#2ca02c")))


def window(trace: Trace) -> tuple[int, int] | None:
    """A few steps from the middle of the first rank's steps: past warm-up, before the end."""
    steps = sorted((r for r in trace.processes[0].ranges if BATCH.match(r.name)), key=lambda r: r.start)
    if not steps:
        return None
    first = max(0, len(steps) // 2 - STEADY_STEPS // 2)
    chosen = steps[first:first + STEADY_STEPS]
    after = steps[first + len(chosen)].start if first + len(chosen) < len(steps) else chosen[-1].end
    return chosen[0].start, after


def draw(trace: Trace, path: Path, title: str) -> dict[str, Any]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = window(trace)
    samples = [s for s in trace.metrics or () if span and span[0] <= s.timestamp < span[1] and s.key in SERIES]
    gpus = sorted({s.device for s in samples})
    fig, axes = plt.subplots(len(gpus) + 1, 1, figsize=(9, 1.8 * len(gpus) + 1.2 + 0.3 * len(trace.processes)),
                             sharex=True, squeeze=False)
    panels = []
    t0 = span[0] if span else 0
    for ax, gpu in zip(axes[:-1, 0], gpus):
        for key in SERIES:
            points = sorted((s.timestamp, s.value) for s in samples if s.device == gpu and s.key == key)
            if points:
                ax.plot([(t - t0) / 1e6 for t, _ in points], [v for _, v in points], label=key, linewidth=0.8)
        ax.set_ylabel(f"GPU {gpu}")
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        panels.append({"gpu": gpu, "series": [line.get_label() for line in ax.get_lines()]})
    bands = _bands(axes[-1, 0], trace, span, t0)
    axes[-1, 0].set_xlabel("ms from the window's start")
    drawn_title = fig.suptitle(title + ("" if gpus else " (no GPU metrics: phase bands only)"), fontsize=9).get_text()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"file": str(path), "title": drawn_title, "window_ns": list(span) if span else None, "panels": panels, "bands": bands}


def _bands(ax, trace: Trace, span, t0: int) -> list[dict]:
    """Per rank, its steps (thin, above) and phases (below) inside the window."""
    drawn = []
    for row, process in enumerate(trace.processes):
        inside = [r for r in process.ranges if span and r.end > span[0] and r.start < span[1]]
        steps = [(r.start, r.end) for r in inside if BATCH.match(r.name)]
        ax.broken_barh([((a - t0) / 1e6, (b - a) / 1e6) for a, b in steps], (row + 0.6, 0.3), facecolors="#444444")
        names = []
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
