"""The comparison's figures, as PNG files (matplotlib, headless Agg backend)."""
# pyright: reportUnknownMemberType=false
# (matplotlib's own annotations leave its methods' **kwargs untyped; everything of ours here is typed)
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..runtime.names import BACKWARD, DATA, DATA_GPU, FORWARD, H2D, OPTIMIZER  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .results import SHARES, Row  # noqa: E402

DPI = 110
PHASE_COLOURS = {DATA: "#d62728", H2D: "#ff7f0e", FORWARD: "#1f77b4", BACKWARD: "#2ca02c",
                 OPTIMIZER: "#9467bd", DATA_GPU: "#8c564b", "other": "#c7c7c7"}


def write_plots(rows: list[Row], out: Path, comm_bench: Optional[dict[str, Any]] = None) -> dict[str, str]:
    """Every figure; returns {title: file name}. `comm_bench`: a bench.comm result to plot."""
    figures: dict[str, tuple[str, Callable[[Axes], None]]] = {
        "Epoch time": ("epoch_time.png", lambda ax: _grouped_bars(ax, rows, "epoch_s", "epoch time (s)")),
        "Images per second": ("images_per_s.png", lambda ax: _grouped_bars(ax, rows, "images_per_s", "images/s")),
    }
    written: dict[str, str] = {}
    for title, (name, draw) in figures.items():
        fig, ax = plt.subplots(figsize=(8, 4))
        draw(ax)
        ax.set_title(title)
        _save(fig, out / name)
        written[title] = name
    _save(_scaling(rows), out / "scaling.png")
    written["Speed-up and scaling efficiency"] = "scaling.png"
    _save(_phases(rows), out / "phases.png")
    written["Where training time goes"] = "phases.png"
    if comm_bench:
        _save(comm_rates(comm_bench), out / "comm_rates.png")
        written["Step time against link rate per hook (bench.comm)"] = "comm_rates.png"
    if any(r.gpu_metrics for r in rows):
        _save(_gpu_metrics(rows), out / "gpu_metrics.png")
        written["GPU metrics inside training epochs"] = "gpu_metrics.png"
    return written


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _grouped_bars(ax: Axes, rows: list[Row], key: str, ylabel: str,
                  value: Callable[[Row, str], Any] = getattr) -> None:
    """One group per process count, one bar per variant; a failed or skipped cell is named, not drawn."""
    labels = list(dict.fromkeys(r.label for r in rows))
    counts = sorted({r.count for r in rows})
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        for j, count in enumerate(counts):
            row = next((r for r in rows if r.label == label and r.count == count), None)
            x = j + (i - (len(labels) - 1) / 2) * width
            height = value(row, key) if row else None
            if height is not None:
                ax.bar(x, height, width, color=f"C{i}", label=label)
            elif row is not None:
                ax.text(x, 0, row.status, rotation=90, ha="center", va="bottom", fontsize=8,
                        color="red" if row.status == "failed" else "grey")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))  # one entry per variant, not per bar
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_xticks(range(len(counts)), [str(c) for c in counts])
    ax.set_xlabel("processes / GPUs")
    ax.set_ylabel(ylabel)


def _scaling(rows: list[Row]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
    speed, eff = axes[0, 0], axes[0, 1]
    labels = list(dict.fromkeys(r.label for r in rows))
    ideal = sorted({(r.count, r.ideal) for r in rows if r.ideal})
    if ideal:
        speed.plot(*zip(*ideal), "k--", label="ideal")
    eff.axhline(100, color="k", linestyle="--", label="ideal")
    for i, label in enumerate(labels):
        done = sorted((r for r in rows if r.label == label and r.speedup), key=lambda r: r.count)
        if done:
            xs = [r.count for r in done]
            speed.plot(xs, [r.speedup for r in done], "o-", color=f"C{i}", label=label)
            eff.plot(xs, [100 * (r.efficiency or 0.0) for r in done], "o-", color=f"C{i}", label=label)
    counts = sorted({r.count for r in rows})
    for ax, title, ylabel in ((speed, "Speed-up", "speed-up (x)"), (eff, "Scaling efficiency", "efficiency (%)")):
        ax.set_title(title)
        ax.set_xlabel("processes / GPUs")
        ax.set_ylabel(ylabel)
        ax.set_xticks(counts)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    eff.set_ylim(bottom=0)
    return fig


def _phases(rows: list[Row]) -> Figure:
    """Stacked shares of training time per cell, from nsys or the loop's own timers."""
    profiled = [r for r in rows if r.phases]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.45 * max(len(profiled), 3)))
    sources = sorted({r.phase_source for r in profiled})
    ax.set_title(f"Where training time goes ({' and '.join(sources) or 'no profile'})")
    if not profiled:
        ax.text(0.5, 0.5, "no profile available\n(run with nsys installed, --profile auto or 1)",
                ha="center", va="center", fontsize=12, transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    names = [r.name if r.phase_source == "nsys" else f"{r.name} ({r.phase_source})" for r in profiled]
    left = [0.0] * len(profiled)
    for phase in SHARES:
        widths = [100 * (r.phases or {}).get(phase, 0.0) for r in profiled]
        ax.barh(names, widths, left=left, color=PHASE_COLOURS[phase], label=phase)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of training time (%)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


# The lab's views: SM active (higher with DALI), DRAM, and PCIe TX/RX (one-sided for DP,
# simultaneous for DDP's all-reduce). Units follow what the nsys release reports.
GPU_METRIC_PANELS = (("sm_active_pct", "SM active (%)"), ("sm_issue_pct", "SM issue (%)"),
                     ("dram_bw_pct", "DRAM bandwidth (%)"), ("pcie_tx_mbps", "PCIe TX (MB/s)"),
                     ("pcie_rx_mbps", "PCIe RX (MB/s)"), ("pcie_tx_pct", "PCIe TX (%)"),
                     ("pcie_rx_pct", "PCIe RX (%)"))


def _gpu_metrics(rows: list[Row]) -> Figure:
    """One panel per metric that some cell sampled: bars per mode, grouped by GPU count."""
    panels = [(k, label) for k, label in GPU_METRIC_PANELS if any(k in (r.gpu_metrics or {}) for r in rows)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), squeeze=False)
    for ax, (key, label) in zip(axes[:, 0], panels):
        _grouped_bars(ax, rows, key, label, value=lambda row, k: (row.gpu_metrics or {}).get(k))
        ax.set_title(f"{label.split(' (')[0]}, mean inside training epochs")
    return fig


def comm_rates(bench: dict[str, Any]) -> Figure:
    """bench.comm: median step time (solid) and exposed comm (dashed) against link rate, per hook;
    the 2-host rows with no delay added (older results have neither field: all of theirs)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    measured: list[dict[str, Any]] = bench["rows"]
    rows = [r for r in measured if r.get("hosts", 2) == 2 and not r.get("delay_requested_ms")]
    hooks = list(dict.fromkeys(r["hook"] for r in rows))
    for i, hook in enumerate(hooks):
        mine = sorted((r for r in rows if r["hook"] == hook), key=lambda r: r["rate_mbit"])
        rates = [r["rate_mbit"] for r in mine]
        ax.plot(rates, [r["step_s"] for r in mine], "o-", color=f"C{i}", label=f"{hook} step")
        if all("exposed_comm_s" in r for r in mine):
            ax.plot(rates, [r["exposed_comm_s"] for r in mine], "x--", color=f"C{i}", alpha=0.6,
                    label=f"{hook} exposed comm")
    env: dict[str, Any] = bench.get("env") or {}
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)  # exposed comm can be 0: a linear axis keeps it
    ax.set_xlabel("link rate (Mbit/s)")
    ax.set_ylabel("seconds per step")
    ax.set_title(f"Step time against link rate: {env.get('model', '?')}, global batch {env.get('batch', '?')}, "
                 f"2 hosts, no delay added (bench.comm)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
