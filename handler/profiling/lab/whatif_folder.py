"""The what-if over a folder of lab-page rows (page.py's rows, compare's cells made into rows): one
path for the lab page's what-if section and handler.compare's predictions, so their cells agree.
Per mode, from its row on the fewest GPUs (or CPU processes): the GPU link from the folder's own
reports of 2 or more GPUs, a CPU run's threads' efficiency (or compute) at n from the other modes'
reports of the machine. The model itself: handler/profiling/whatif.py and scaling/. Each row holds
its parsed summary (record/summary.py); nothing here reads a raw one.
"""
from typing import TYPE_CHECKING, TypedDict

from handler.runtime.errors import UserError

from ..record.summary import Machine
from ..scaling.cores import cpu_work, efficiency
from ..scaling.facts import gradients, job_split, machine_read, mode_name
from ..scaling.links import Link, measured, payload
from ..scaling.scale import cpu_factors
from ..scaling.step import Split
from ..whatif import ASSUMPTIONS, COUNTS, Prediction, bounds_legend, markdown, predictions, run_mode

if TYPE_CHECKING:
    from .page import LabRow


class ModePrediction(TypedDict):
    """A mode's prediction from its base row, or None and why."""
    base: "LabRow"
    found: Prediction | None
    why: str


def lab_section(rows: "list[LabRow]") -> list[str]:
    """The lab page's what-if section (page.py): per mode, from its report on
    the fewest GPUs, every count of the matrix beside the measured ones (folder_predictions): the GPU
    link from the folder's own reports of 2 or more GPUs; a CPU run's cores from its own CPU time, else
    its compute at n from other modes' reports."""
    lines = ["", "## What-if: the next run, predicted", "", ASSUMPTIONS, "", *bounds_legend(), ""]
    problem, by_mode = folder_predictions(rows)
    if problem:
        return [*lines, problem, ""]
    for mode, got in by_mode.items():
        found = got["found"]
        if found is None:
            lines += [f"- **{mode}**: no prediction: {got['why']}.", ""]
            continue
        seen = {r["gpus"]: s for r in rows if r["mode"] == mode and (s := r["epoch_s"])}
        lines += [f"### {mode}", "", *markdown(found, f"the {mode} report", seen), ""]
    return lines


def folder_predictions(rows: "list[LabRow]", counts: tuple[int, ...] = COUNTS) -> tuple[str, dict[str, ModePrediction]]:
    """The predictions of a folder of lab-page rows, one path for the lab page and handler.compare (so
    their cells agree): per mode, from its row on the fewest GPUs, at `counts` and every count the mode
    measured, with the GPU link from the folder's own reports of 2 or more GPUs and a CPU run's compute
    at n from other modes' reports. ("", {mode: {"base": row, "found": predictions(...) or None, "why":
    why none}}), or (one line, {}) where the machine could not be read from the reports."""
    splits: dict[str, dict[int, Split]] = {}
    machines: dict[str, dict[int, Machine]] = {}
    for r in rows:
        try:
            splits.setdefault(r["mode"], {})[r["gpus"]] = job_split(r["summary"])[0]
        except UserError:
            continue
        machines.setdefault(r["mode"], {})[r["gpus"]] = machine_read(r["summary"].machine)
    link = _folder_link(rows, splits)
    out: dict[str, ModePrediction] = {}
    for mode in sorted({r["mode"] for r in rows}):
        # the fewest GPUs with a complete epoch: a run cut short in its first epoch has no step to scale
        base = min((r for r in rows if r["mode"] == mode), key=lambda r: (r["epoch_s"] is None, r["gpus"]))
        try:
            found = predictions(base["summary"], (*counts, *(r["gpus"] for r in rows if r["mode"] == mode)),
                                link=link if base["gpus_ran"] else None, mode=mode_name(mode) or _mode(mode, base),
                                factors=_factors(mode, base, splits, machines))
            out[mode] = {"base": base, "found": found, "why": ""}
        except UserError as err:
            cut = base["incomplete"]  # a run cut short before its first epoch ended says so, not "no steps"
            out[mode] = {"base": base, "found": None, "why": cut.line if cut and not cut.complete_epochs else str(err)}
        except Exception as err:  # a fault of the what-if's costs its row's line, never the page
            out[mode] = {"base": base, "found": None, "why": f"the what-if could not predict from this report: a "
                         f"fault in the what-if, not in the report ({type(err).__name__}: {err}); the rest of the page "
                         "stands"}
    return "", out


def _mode(mode: str, row: "LabRow") -> str:
    """The lab page's modes are the kit's names (or compare's labels, which start with the mode)."""
    name = _name(mode)
    return "dp" if name == "dp" or row["processes"] < row["gpus_ran"] else "pp" if name == "pp" else "ddp"


def _name(mode: str) -> str:
    """The mode a lab-page row names: `dp`, or compare's `dp+amp [fp16]`, is dp."""
    return mode.split()[0].split("+")[0]


def _folder_link(rows: "list[LabRow]", splits: dict[str, dict[int, Split]]) -> Link | None:
    """The GPU link a report of 2 or more GPUs on one node in the folder measured (one process per GPU).
    A job of several nodes is left out: its NCCL time is the link between its nodes, which its own
    prediction reads as such (whatif.predictions), the same on the lab page as in the what-if CLI."""
    for r in sorted(rows, key=lambda r: -r["gpus"]):
        split = splits.get(r["mode"], {}).get(r["gpus"])
        run = r["summary"].run
        if split is None or not split.gpu or _mode(r["mode"], r) != "ddp" or (run.nodes if run else 1) > 1:
            continue
        summary = r["summary"]
        try:
            grad, _, model = gradients(summary)
            sent = payload(grad, model, summary.comm_config, split.buckets, run_mode(summary))
        except UserError:  # its mode's section says why, in its own line
            continue
        found = measured(split, summary, sent, f"from the NCCL kernels of {r['mode']}, {r['gpus']} GPUs in this folder")
        if found:
            return found
    return None


def _factors(mode: str, base: "LabRow", splits: dict[str, dict[int, Split]],
             machines: dict[str, dict[int, Machine]] | None = None) -> dict[int, float]:
    """A CPU run's compute at other counts, from the other modes of rank-per-process (not dp, not pp):
    where the run recorded its CPU time, the threads' efficiency their reports measured beside the
    cores model (cores.efficiency, each mode's own loaders taken out); else their compute's ratio
    (scale.cpu_compute reads either)."""
    if base["gpus_ran"] or _mode(mode, base) != "ddp" or base["gpus"] not in splits.get(mode, {}):
        return {}  # no split of the base (a run cut short in its first epoch): predictions says why
    others = {m: by for m, by in splits.items() if m != mode and _name(m) not in ("dp", "pp")
              and all(not s.gpu for s in by.values())}
    machines = machines or {}
    own = machines.get(mode, {}).get(base["gpus"], Machine())
    if cpu_work(splits[mode][base["gpus"]], base["gpus"], own) is not None:
        return efficiency({m: {n: (s, machines.get(m, {}).get(n, Machine())) for n, s in by.items()}
                           for m, by in others.items()}, base["gpus"])
    return cpu_factors(others, base["gpus"])
