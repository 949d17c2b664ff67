"""Properties of the what-if's model (handler/profiling/whatif.py, scaling/), checked on generated coherent
runs: every mode (dp, ddp, ddp_dali, fsdp, pp) x 1, 2, 4, 8 devices x 1 or 2 nodes x GPU or CPU x both
NVTX conventions (ours waits in `data`/`h2d` inside the step, the kit's between the steps), each
summary one that the records (handler/profiling/record/) accept, with the run block and the machine
block present or left out. Every field at its edges: test_record_properties.py, from the records' schema."""
import copy
import json
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from handler.compare.predict import add_predictions
from handler.compare.results import build_rows
from handler.profiling import whatif
from handler.profiling.lab import whatif_folder
from handler.profiling.lab.page import summary_row, verdict
from handler.profiling.record.metrics import Metrics
from handler.profiling.record.parse import parse_summary
from handler.profiling.scaling.links import Link
from handler.profiling.scaling.step import split_of
from handler.runtime.errors import UserError
from tests.profiling.lab.test_whatif import _outcome

MODES = ("dp", "ddp", "ddp_dali", "fsdp", "pp")
FAST = settings(derandomize=True, database=None, deadline=None, max_examples=80)
SPARSE = settings(derandomize=True, database=None, deadline=None, max_examples=60)


def build(mode, count, nodes, gpu, kit, steps, epochs, step_ms, wait, busy, exposed, comm, micro, machine, run):
    """A summary JSON as report.py writes it (fields the readers use), for one run of `count` devices."""
    processes = 1 if mode == "dp" else count
    epochs_s = step_ms * steps / 1e3
    wait_ms, exposed_ms = wait * step_ms, exposed * step_ms
    inside = step_ms - (wait_ms if kit else 0.0)
    loop = {"epochs": epochs, "steps": steps, "epochs_s": epochs_s, "step_mean_ms": step_ms, "inside_steps_ms": inside,
            "between_steps_ms": step_ms - inside,
            "phase_ms": {"data": 0.0 if kit else wait_ms, "h2d": 0.0, "forward": 0.3 * step_ms,
                         "backward": 0.5 * step_ms, "optimizer": 0.05 * step_ms}}
    measured = mode != "pp" and (count > 1 or comm)
    rank_comm = {"source": "allreduce ranges", "seconds": (exposed_ms + comm * step_ms) * steps / 1e3,
                 "exposed_s": exposed_ms * steps / 1e3, "buckets": 3} if measured else None
    ranks = [{"rank": r, "loop": copy.deepcopy(loop), "comm": rank_comm,
              "epochs": [{"epoch": e, "time_s": epochs_s / epochs} for e in range(epochs)]} for r in range(processes)]
    if mode == "pp":
        for r in ranks:
            r["pipeline"] = {"stage": r["rank"], "theoretical_bubble_share": (count - 1) / (micro + count - 1),
                             "span_s": 0.9 * step_ms * steps / 1e3}
    share = busy * (1 - exposed)
    gpus = [{"device": d, "host": f"node{d * nodes // count}", "compute_busy_share": share, "kernel_busy_share": share,
             "epochs_s": epochs_s, "nccl_kernel_s": (exposed_ms + comm * step_ms) * steps / 1e3 if measured else 0.0}
            for d in range(count)] if gpu else []
    summary = {"schema": 1, "report": f"cells/{mode}-n{count}/{mode}-n{count}.nsys-rep", "ranks": ranks, "gpus": gpus,
               "overall": {"epoch_mean_s": epochs_s / epochs, "phase_shares": {}, "gpu_phase_shares": None},
               "model": "resnet20", "comm_config": None}
    if machine:
        summary["machine"] = machine
    if run:
        summary["run"] = {"mode": mode, "mode_from": "metrics config.mode", "model": "resnet20",
                          "model_from": "metrics config.model", "grad_mb": 1.079, "grad_mb_from": "metrics model.grad_mb",
                          "nodes": nodes, "gpus_per_node": count // nodes if gpu else 0, "processes": processes,
                          "pp_stages": count if mode == "pp" else None, "pp_microbatches": micro if mode == "pp" else None,
                          "pp_from": "metrics config.microbatches" if mode == "pp" else None}
    return summary


@st.composite
def runs(draw, run=None):
    mode = draw(st.sampled_from(MODES))
    count = draw(st.sampled_from((1, 2, 4, 8)))
    gpu = draw(st.booleans()) or mode == "dp"
    nodes = draw(st.sampled_from((1, 2))) if gpu and count > 1 and mode not in ("dp", "pp") else 1
    machine = draw(st.one_of(st.none(), st.builds(
        lambda cores, workers, rank: {"cpu_cores": cores, "cpu_cores_from": "nsys TARGET_INFO_SYSTEM_ENV CpuCores",
                                      "loader_workers": workers, "loader_workers_from": "metrics config.workers",
                                      **({"rank_cores": rank, "rank_cores_from": "metrics env.cpu_cores"} if rank else {})},
        st.sampled_from((None, 2, 18, 128)), st.sampled_from((None, 0.0, 2.0)), st.sampled_from((None, 2, 8)))))
    return build(mode, count, nodes, gpu, draw(st.booleans()), draw(st.integers(5, 200)), draw(st.integers(1, 3)),
                 draw(st.floats(5.0, 2000.0)), draw(st.floats(0.0, 0.9)), draw(st.floats(0.05, 1.0)),
                 draw(st.floats(0.0, 0.3)), draw(st.floats(0.0, 0.2)), draw(st.integers(1, 16)), machine,
                 draw(st.booleans()) if run is None else run)


def own_count(found) -> int:
    split = found["split"]
    return split.devices if split.gpu else split.processes


def cells_of(found) -> dict:
    return {c["count"]: c for c in found["cells"]}


@FAST
@given(runs())
def test_at_its_own_count_the_prediction_is_the_measured_step_and_the_verdicts_bound(summary):
    parse_summary(summary, "generated")
    found = whatif.predictions(summary)
    own = cells_of(found)[own_count(found)]
    assert own["step_ms"] == pytest.approx(split_of(summary).step * 1e3, rel=1e-9)
    said = verdict(summary)
    assert own["keeps_up_epoch_s"] == pytest.approx(said["bound_s"], rel=1e-9) and own["bound"] == said["bound"]


@FAST
@given(runs())
def test_nothing_computes_faster_than_the_work_allows(summary):
    found = whatif.predictions(summary)
    split, m = found["split"], own_count(found)
    cells = cells_of(found)
    for n, c in cells.items():
        terms = c["terms_ms"]
        compute = terms["device"] if split.gpu else terms["cores"]
        assert c["epoch_s"] >= compute / 1e3 * split.steps_per_epoch * (1 - 1e-9)  # never below its compute alone
        if split.gpu or found["mode"] == "pp":  # a CPU run's ranks share one host's cores (held, or measured)
            assert compute >= split.busy * 1e3 * m / n * (1 - 1e-9), (n, found["mode"])
        if found["mode"] == "dp" and n < m:
            assert compute >= cells[m]["terms_ms"]["device"] * (1 - 1e-9)  # fewer GPUs: never less per GPU


def implied(found, n, template) -> dict:
    """The summary a predicted cell implies: its terms as a measured run of n devices would report them."""
    c, split = cells_of(found)[n], found["split"]
    t = {k: v / 1e3 for k, v in c["terms_ms"].items()}
    step = c["step_ms"] / 1e3
    processes = c["processes"]
    steps = split.steps_per_epoch * split.epochs
    epochs_s = step * steps
    loop = {"epochs": split.epochs, "steps": steps, "epochs_s": epochs_s, "step_mean_ms": step * 1e3,
            "inside_steps_ms": (step - t["loader"]) * 1e3, "between_steps_ms": t["loader"] * 1e3,
            "phase_ms": {"data": 0.0, "h2d": 0.0, "forward": 1.0 - split.compute_share,
                         "backward": split.compute_share, "optimizer": 0.0}}
    comm = {"source": "allreduce ranges", "seconds": c["comm_ms"] / 1e3 * steps, "exposed_s": t["link"] * steps,
            "buckets": split.buckets} if n > 1 or c["comm_ms"] else None
    out = json.loads(json.dumps(template))
    out.pop("measured_epoch", None)  # the implied run's epochs are the ranks' below (scaling/epochs.py reads them)
    out["ranks"] = [{"rank": r, "loop": dict(loop), "comm": comm,
                     "epochs": [{"epoch": e, "time_s": epochs_s / split.epochs} for e in range(split.epochs)]}
                    for r in range(processes)]
    if split.gpu:
        out["gpus"] = [{"device": d, "compute_busy_share": t["device"] / step, "kernel_busy_share": t["device"] / step,
                        "epochs_s": epochs_s, "nccl_kernel_s": 0.0} for d in range(n)]
    run = out.get("run")
    if run:
        run.update(nodes=1, gpus_per_node=n if split.gpu else 0, processes=processes)
    return out


@FAST
@given(runs(run=True), st.sampled_from((1, 2, 4, 8)))
def test_a_round_trip_m_to_n_and_back_returns_the_measured_step_within_one_percent(summary, n):
    """Data-parallel modes over one given link (the link a report measures is the thing predicted, not
    re-read; the ddp family's all-reduce, bench.comm's model checked against measured exchanges there,
    rides a link of no cost, dp's broadcast and gather 25 Gbit/s). Left out: pp (its span at one stage
    holds no bubble to give back), a cell whose GPU outlasts the host's wait and work: no report can hold it (a report's GPU time fits inside its
    step range, the rest of which it books to the host), so it has no summary to predict back from, and a dp
    report that exchanged faster than the given link allows (its host and link terms less than the link's
    broadcast and gather): going down, the model takes off what the report holds, never more, so the way
    back adds more than it took."""
    mode = summary["run"]["mode"]
    assume(mode != "pp" and summary["run"]["nodes"] == 1)
    link = Link(25.0, 10.0) if mode == "dp" else Link(1e9, 0.0)
    if mode != "dp":  # the all-reduce's own model is bench.comm's, fitted to and checked on measured exchanges
        for r in summary["ranks"]:
            r["comm"] = None
    there = whatif.predictions(summary, (n,), link)
    m = own_count(there)
    own = cells_of(there)[m]
    assume(mode != "dp" or own["comm_ms"] <= (own["terms_ms"]["host"] + own["terms_ms"]["link"]) * (1 + 1e-9))
    t = cells_of(there)[n]["terms_ms"]
    assume(t.get("device", 0.0) <= (t["loader"] + t.get("host", t.get("cores", 0.0))) * (1 + 1e-9))
    back = whatif.predictions(implied(there, n, summary), (m,), link)
    assert cells_of(back)[m]["step_ms"] == pytest.approx(split_of(summary).step * 1e3, rel=0.01)


def lab_row(summary, mode) -> dict:
    split = split_of(summary)
    entry = {"report": summary["report"], "mode": mode, "gpus": own_count({"split": split}), "model": summary.get("model")}
    return summary_row(parse_summary(summary, "generated"), entry, None)


@SPARSE
@given(runs(run=True))
def test_the_cli_the_lab_page_and_compare_give_the_same_numbers(summary):
    mode = summary["run"]["mode"]
    found = whatif.predictions(summary)
    own = own_count(found)
    cli = {c["count"]: f"{c['epoch_s']:.2f}" for c in found["cells"]}
    table = whatif.markdown(found, "x")
    for n, epoch in cli.items():
        assert any(line.startswith(f"| {whatif.devices(n, found['split'].gpu)}") and f"| {epoch} |" in line
                   for line in table)
    lab = "\n".join(whatif_folder.lab_section([lab_row(summary, mode)]))
    for n, epoch in cli.items():
        assert f"| {whatif.devices(n, found['split'].gpu)}" in lab and f"| {epoch} |" in lab, (n, epoch)
    bigger = [n for n in (2, 4, 8) if n > own]
    assume(bigger)
    epoch = summary["overall"]["epoch_mean_s"]
    outcomes = [_outcome(mode, own, epoch, summary), _outcome(mode, bigger[0], epoch, None)]
    for o in outcomes:
        o.metrics = Metrics.model_validate({"epochs": [{"time_s": epoch, "images_per_s": 1.0, "data_wait_s": 0.0}] * 3})
    rows = build_rows(outcomes)
    add_predictions(rows, outcomes)
    predicted = next(r for r in rows if r.count == bigger[0]).predicted_epoch_s
    assert predicted == pytest.approx(cells_of(whatif.predictions(summary, (bigger[0],)))[bigger[0]]["epoch_s"], rel=1e-9)
