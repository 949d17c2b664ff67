"""The what-if over a folder of lab-page rows (page.py's rows, compare's cells made into rows): one
path for the lab page's what-if section and handler.compare's predictions, so their cells agree.
Per mode, from its row on the fewest GPUs (or CPU processes): the GPU link from the folder's own
reports of 2 or more GPUs, a CPU run's threads' efficiency (or compute) at n from the other modes'
reports of the machine. The model itself: handler/profiling/whatif.py and scaling/.
"""
from handler.runtime.errors import UserError

from ..scaling.cores import cpu_work, efficiency
from ..scaling.facts import gradients, machine_read, mode_name
from ..scaling.links import Link, measured, payload
from ..scaling.scale import cpu_factors
from ..scaling.step import Split, split_of
from ..whatif import ASSUMPTIONS, COUNTS, bounds_legend, markdown, predictions, run_mode


def lab_section(rows: list[dict]) -> list[str]:
    """The lab page's what-if section (page.py): per mode, from its report on
    the fewest GPUs, every count of the matrix beside the measured ones (folder_predictions): the GPU
    link from the folder's own reports of 2 or more GPUs; a CPU run's cores from its own CPU time, else
    its compute at n from other modes' reports."""
    lines = ["", "## What-if: the next run, predicted", "", ASSUMPTIONS, "", *bounds_legend(), ""]
    problem, by_mode = folder_predictions(rows)
    if problem:
        return [*lines, problem, ""]
    for mode, got in by_mode.items():
        if got["found"] is None:
            lines += [f"- **{mode}**: no prediction: {got['why']}.", ""]
            continue
        measured = {r["gpus"]: r["epoch_s"] for r in rows if r["mode"] == mode and r["epoch_s"]}
        lines += [f"### {mode}", "", *markdown(got["found"], f"the {mode} report", measured), ""]
    return lines


def folder_predictions(rows: list[dict], counts=COUNTS) -> tuple[str, dict]:
    """The predictions of a folder of lab-page rows, one path for the lab page and handler.compare (so
    their cells agree): per mode, from its row on the fewest GPUs, at `counts` and every count the mode
    measured, with the GPU link from the folder's own reports of 2 or more GPUs and a CPU run's compute
    at n from other modes' reports. ("", {mode:
    {"base": row, "found": predictions(...) or None, "why": why none}}), or (one line, {}) where the
    machine could not be read from the reports."""
    try:
        summaries = {id(r): _summary_of(r) for r in rows}
        splits: dict[str, dict[int, Split]] = {}
        machines: dict[str, dict[int, dict]] = {}
        for r in rows:
            try:
                splits.setdefault(r["mode"], {})[r["gpus"]] = split_of(summaries[id(r)])
            except UserError:
                continue
            machines.setdefault(r["mode"], {})[r["gpus"]] = machine_read(r.get("machine") or {})
        link = _folder_link(rows, summaries, splits)
    except Exception as err:  # what the folder's reports say of the machine; never the page
        return (f"No prediction: the what-if could not read the machine from these reports "
                f"({type(err).__name__}: {err}); the rest of the page stands."), {}
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        # the fewest GPUs with a complete epoch: a run cut short in its first epoch has no step to scale
        base = min((r for r in rows if r["mode"] == mode), key=lambda r: (r["epoch_s"] is None, r["gpus"]))
        try:
            found = predictions(summaries[id(base)], (*counts, *(r["gpus"] for r in rows if r["mode"] == mode)),
                                link=link if base["gpus_ran"] else None, mode=mode_name(mode) or _mode(mode, base),
                                factors=_factors(mode, base, splits, machines))
            out[mode] = {"base": base, "found": found, "why": ""}
        except UserError as err:
            cut = base.get("incomplete")  # a run cut short before its first epoch ended says so, not "no steps"
            out[mode] = {"base": base, "found": None,
                         "why": str(cut["line"] if cut and not cut["complete_epochs"] else err)}
        except Exception as err:  # a fault of the what-if's costs its row's line, never the page
            out[mode] = {"base": base, "found": None, "why": f"the what-if could not predict from this report: a "
                         f"fault in the what-if, not in the report ({type(err).__name__}: {err}); the rest of the page "
                         "stands"}
    return "", out


def _summary_of(row: dict) -> dict:
    return {"ranks": row["ranks"], "gpus": row["gpu_table"], "model": row.get("model"), "report": row["report"],
            "machine": row.get("machine"), "comm_config": row.get("comm_config"), "run_mode": row.get("mode"),
            **({"run": row["run"]} if row.get("run") else {})}


def _mode(mode: str, row: dict) -> str:
    """The lab page's modes are the kit's names (or compare's labels, which start with the mode)."""
    name = _name(mode)
    return "dp" if name == "dp" or row.get("processes", 0) < row.get("gpus_ran", 0) else "pp" if name == "pp" else "ddp"


def _name(mode: str) -> str:
    """The mode a lab-page row names: `dp`, or compare's `dp+amp [fp16]`, is dp."""
    return mode.split()[0].split("+")[0]


def _folder_link(rows: list[dict], summaries: dict, splits: dict) -> Link | None:
    """The GPU link a report of 2 or more GPUs on one node in the folder measured (one process per GPU).
    A job of several nodes is left out: its NCCL time is the link between its nodes, which its own
    prediction reads as such (whatif.predictions), the same on the lab page as in the what-if CLI."""
    for r in sorted(rows, key=lambda r: -r["gpus"]):
        split = splits.get(r["mode"], {}).get(r["gpus"])
        if split is None or not split.gpu or _mode(r["mode"], r) != "ddp" or ((r.get("run") or {}).get("nodes") or 1) > 1:
            continue
        summary = summaries[id(r)]
        try:
            grad, _, model = gradients(summary)
            sent = payload(grad, model, summary.get("comm_config"), split.buckets, run_mode(summary))
        except UserError:  # its mode's section says why, in its own line
            continue
        found = measured(split, summary, sent, f"from the NCCL kernels of {r['mode']}, {r['gpus']} GPUs in this folder")
        if found:
            return found
    return None


def _factors(mode: str, base: dict, splits: dict, machines: dict | None = None) -> dict:
    """A CPU run's compute at other counts, from the other modes of rank-per-process (not dp, not pp):
    where the run recorded its CPU time, the threads' efficiency their reports measured beside the
    cores model (cores.efficiency, each mode's own loaders taken out); else their compute's ratio
    (scale.cpu_compute reads either)."""
    if base["gpus_ran"] or _mode(mode, base) != "ddp" or base["gpus"] not in splits.get(mode, {}):
        return {}  # no split of the base (a run cut short in its first epoch): predictions says why
    others = {m: by for m, by in splits.items() if m != mode and _name(m) not in ("dp", "pp")
              and all(not s.gpu for s in by.values())}
    machines = machines or {}
    if cpu_work(splits[mode][base["gpus"]], base["gpus"], machines.get(mode, {}).get(base["gpus"], {})) is not None:
        return efficiency({m: {n: (s, machines.get(m, {}).get(n, {})) for n, s in by.items()}
                           for m, by in others.items()}, base["gpus"])
    return cpu_factors(others, base["gpus"])
