"""The one measured epoch (handler/profiling/scaling/epochs.py): the warm-up left out, the median of the
rest, its spread, and noisy where that spread is past the stated share; the what-if's step taken
from it; and the lab page, the what-if and handler.compare's report saying the same of one run."""
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from handler.compare.cells import Cell, Variant
from handler.compare.predict import add_predictions
from handler.compare.report import write_report
from handler.compare.results import build_rows
from handler.compare.runner import Outcome
from handler.profiling.lab.page import verdict, write_cells_lab
from handler.profiling.record.metrics import Metrics
from handler.profiling.record.parse import parse_summary
from handler.profiling.report import main as report_main
from handler.profiling.scaling.epochs import NOISY_SHARE, of_metrics, of_summary, of_times
from handler.profiling.scaling.step import split_of
from handler.profiling.whatif import predictions
from tests.nsys_helpers import REPO

NOISY = [30.0, 10.0, 10.0, 16.0]  # a slow warm-up, then one epoch disturbed by another job beside the run
QUIET = [30.0, 10.0, 10.1, 9.9]
CPU_RUN = REPO / "tests" / "data" / "nsys" / "ddp_workers2_cpu2_nsys2022.4.sqlite"  # 2 ranks, 3 epochs


def summary(epoch_times: list[float], steps_per_epoch: int = 10, inside_share: float = 0.9, data_share: float = 0.1,
            exposed_share: float = 0.05, busy_share: float | None = None) -> dict:
    """A one-rank summary as the report writes it; the loop's shares are of the mean step over every epoch."""
    epochs_s = sum(epoch_times)
    steps = steps_per_epoch * len(epoch_times)
    mean_ms = epochs_s / steps * 1e3
    loop = {"epochs_s": epochs_s, "epochs": len(epoch_times), "steps": steps, "step_mean_ms": mean_ms,
            "inside_steps_ms": mean_ms * inside_share, "between_steps_ms": mean_ms * (1 - inside_share),
            "phase_ms": {"data": mean_ms * inside_share * data_share, "forward": mean_ms * 0.3, "backward": mean_ms * 0.4}}
    gpus = [] if busy_share is None else [{"device": 0, "compute_busy_share": busy_share, "kernel_busy_share": busy_share,
                                           "epochs_s": epochs_s, "nccl_kernel_s": 0.0, "memcpy": {}, "metrics": {}}]
    return {"schema": 1, "report": "nsight_logs/ddp_20261129_070000/gpu_1.nsys-rep", "overall": {"epoch_mean_s": None, "phase_shares": {}},
            "gpus": gpus, "ranks": [{"rank": 0, "epochs": [{"epoch": e, "time_s": t} for e, t in enumerate(epoch_times)],
                                     "loop": loop, "comm": {"seconds": epochs_s * exposed_share * 2,
                                                            "exposed_s": epochs_s * exposed_share, "buckets": 2}}]}


def test_a_disturbed_epoch_after_the_warm_up_is_named_noisy_and_a_steady_run_is_not():
    noisy, quiet = of_times(list(enumerate(NOISY))), of_times(list(enumerate(QUIET)))
    assert noisy["s"] == 10.0 and noisy["epochs"] == [1, 2, 3] and noisy["spread"] == pytest.approx(0.6) and noisy["noisy"]
    assert quiet["s"] == 10.0 and quiet["spread"] == pytest.approx(0.02) and not quiet["noisy"]
    assert NOISY_SHARE == 0.10


def test_one_epoch_is_its_own_measured_epoch_and_none_is_none():
    assert of_times([(0, 12.5)]) | {"rule": ""} == {"s": 12.5, "epochs": [0], "spread": 0.0, "noisy": False, "rule": "",
                                                    "fastest_s": 12.5, "slowest_s": 12.5}
    assert of_times([])["s"] is None and of_metrics(Metrics.model_validate({"epochs": []}))["s"] is None


def test_an_older_summary_without_the_field_gets_it_from_its_ranks_each_epoch_its_slowest_rank():
    two = summary(NOISY)
    two["ranks"].append({**two["ranks"][0], "rank": 1, "epochs": [{"epoch": e, "time_s": t + 0.5}
                                                                    for e, t in enumerate(NOISY)]})
    found = of_summary(parse_summary(two, "two"))
    assert "measured_epoch" not in two and found["s"] == 10.5 and found["epochs"] == [1, 2, 3]


def test_the_summary_of_a_real_capture_carries_the_measured_epoch_of_its_ranks(tmp_path):
    from handler.profiling.analysis import summarize
    from handler.profiling.trace import load_trace
    written = summarize(load_trace(CPU_RUN))["measured_epoch"]
    ranks = summarize(load_trace(CPU_RUN))["ranks"]
    expected = of_times([(e["epoch"], max(r["epochs"][i]["time_s"] for r in ranks)) for i, e in enumerate(ranks[0]["epochs"])])
    assert written == {k: expected[k] for k in ("s", "epochs", "spread", "noisy", "rule")}
    assert written["epochs"] == [1, 2] and not written["noisy"]


@settings(derandomize=True, database=None, deadline=None, max_examples=60)
@given(st.lists(st.floats(0.5, 50.0), min_size=1, max_size=6), st.floats(0.2, 0.99), st.floats(0.0, 0.9),
       st.floats(0.0, 0.3), st.one_of(st.none(), st.floats(0.05, 1.0)))
def test_the_what_if_reproduces_the_measured_epoch_at_its_own_count_and_the_bound_never_exceeds_it(
        times, inside, data, exposed, busy):
    s = summary(times, inside_share=inside, data_share=data, exposed_share=exposed * inside, busy_share=busy)
    split, measured = split_of(s), of_summary(parse_summary(s, "s"))
    assert split.step * split.steps_per_epoch == pytest.approx(measured["s"])
    assert split.wait + split.host + split.exposed == pytest.approx(split.step)
    assert min(split.wait, split.host, split.exposed, split.busy) >= -1e-12
    own = {c["count"]: c for c in predictions(s, (1, 2))["cells"]}[1]
    assert own["epoch_s"] == pytest.approx(measured["s"])
    assert verdict(s)["bound_s"] <= measured["s"] * (1 + 1e-9)


def test_a_slow_first_epoch_no_longer_inflates_the_prediction():
    """Seen: a run with a slow first epoch predicted 15.3 s on the lab page where compare predicted 5.4 s."""
    steady, slow_start = summary([10.0, 10.0, 10.0]), summary([40.0, 10.0, 10.0])
    at = {n: {c["count"]: c["epoch_s"] for c in predictions(x, (2,))["cells"]}[2] for n, x in (("a", steady), ("b", slow_start))}
    assert at["b"] == pytest.approx(at["a"])


def _whatif(tmp_path: Path, times: list[float]) -> str:
    (tmp_path / "x.summary.json").write_text(json.dumps(summary(times)))
    done = subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(tmp_path / "x.summary.json"), "--gpus", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_what_if_names_a_noisy_base_and_how_far_each_prediction_could_move(tmp_path):
    noisy, quiet = _whatif(tmp_path, NOISY), _whatif(tmp_path, QUIET)
    assert "NOISY" in noisy and "| could move s |" in noisy
    assert "its measured epoch 10 s: the median of epochs 1-3, spread 60 %" in noisy
    two = next(line for line in noisy.splitlines() if line.startswith("| 2 CPU processes |"))
    predicted, move = two.split(" | ")[1:3]
    low, high = map(float, move.split("-"))
    assert low == pytest.approx(float(predicted), abs=0.01) and high == pytest.approx(float(predicted) * 1.6, abs=0.01)
    assert "NOISY" not in quiet and "could move" not in quiet and "spread 2 %" in quiet


def _stretched(source: Path, target: Path, epoch: int, factor: float, keep_ranks: int = 2) -> Path:
    """A copy of a real capture whose `epoch` and everything after it took `factor` times as long (another
    job beside the run), with only the first `keep_ranks` ranks' ranges."""
    target.write_bytes(source.read_bytes())
    with sqlite3.connect(target) as db:
        text = "coalesce(e.text, (SELECT value FROM StringIds s WHERE s.id = e.textId))"
        start = db.execute(f"SELECT min(start) FROM NVTX_EVENTS e WHERE {text} = ?", (f"epoch {epoch}",)).fetchone()[0]
        for column in ("start", "end"):
            db.execute(f"UPDATE NVTX_EVENTS SET {column} = ? + CAST(({column} - ?) * ? AS INTEGER) WHERE {column} >= ?",
                       (start, start, factor, start))
        db.execute("UPDATE ANALYSIS_DETAILS SET duration = ? + CAST((duration - ?) * ? AS INTEGER)", (start, start, factor))
        ranks = sorted(tid for (tid,) in db.execute(f"SELECT globalTid FROM NVTX_EVENTS e WHERE {text} LIKE 'rank %'"))
        for tid in ranks[keep_ranks:]:
            db.execute("DELETE FROM NVTX_EVENTS WHERE (globalTid >> 24) & 16777215 = ?", ((tid >> 24) & 0xFFFFFF,))
    return target


def _cell(tmp_path: Path, count: int, report: Path) -> Outcome:
    """One finished compare cell, its summary JSON written by the report's own CLI (as launch.sh does)."""
    metrics = {"config": {"mode": "ddp", "model": "resnet20", "num_gpu": count, "workers": 2},
               "env": {"cpu_cores": 2}, "epochs": [{"epoch": e, "time_s": 9.0, "images_per_s": 100.0,
                                                     "data_wait_s": 1.0} for e in range(3)]}
    (tmp_path / f"{report.stem}.metrics.json").write_text(json.dumps(metrics))
    report_main([str(report), "--metrics", str(tmp_path / f"{report.stem}.metrics.json"), "--brief"])
    profile = json.loads((report.parent / f"{report.stem}.summary.json").read_text())
    return Outcome(Cell(Variant("ddp", "ddp"), count), "ok", 0, metrics=metrics, profile=profile, folder=f"cells/ddp-n{count}")


def test_compares_report_and_its_lab_page_print_the_same_cells_and_both_name_a_noisy_base(tmp_path):
    """One compare folder: its report.md and lab/lab.md agree cell by cell, measured and predicted
    (seen: 5.18 vs 4.66 s predicted, 3.97 vs 3.94 s measured, for one ddp cell at 2 processes)."""
    one = _stretched(CPU_RUN, tmp_path / "ddp_1.sqlite", epoch=2, factor=1.6, keep_ranks=1)
    two = _stretched(CPU_RUN, tmp_path / "ddp_2.sqlite", epoch=2, factor=1.0)
    outcomes = [_cell(tmp_path, 1, one), _cell(tmp_path, 2, two)]
    rows = build_rows(outcomes)
    add_predictions(rows, outcomes)
    prov = {"date": "2026-11-29", "command": "python -m handler.compare", "code": "test", "hardware": {
        "cpu": "cpu", "cores": 2, "memory_gib": 1.0, "gpus": []}, "versions": {
        "python": "3", "torch": "t", "torchvision": "v", "dali": None, "nsys": None}}
    write_report(tmp_path, rows, {}, prov, {}, "synthetic", True)
    lab = write_cells_lab([("ddp", o.cell.count, r, o.metrics) for o, r in zip(outcomes, (one, two))], tmp_path / "lab")
    assert lab is not None
    report, page = (tmp_path / "report.md").read_text(), lab.read_text()
    cells = {c["name"]: c for c in json.loads((tmp_path / "results.json").read_text())["cells"]}
    reports = {r["gpus"]: r for r in json.loads((tmp_path / "lab" / "lab.json").read_text())["reports"]}
    for n in (1, 2):  # the measured cell: one number on both pages, from the nsys epochs
        assert cells[f"ddp x{n}"]["epoch_s"] == reports[n]["epoch_s"] and cells[f"ddp x{n}"]["epoch_from"] == "nsys epoch ranges"
    predicted = next(line for line in report.splitlines() if line.startswith("| ddp x2 | ddp x1 |")).split(" | ")
    on_lab = next(line for line in page.split("### ddp", 1)[1].splitlines() if line.startswith("| 2 CPU processes |")).split(" | ")
    assert predicted[2] == on_lab[1] and predicted[4] == on_lab[3]  # predicted, measured
    assert predicted[3] == on_lab[2]  # how far it could move: the base (x1) had a disturbed epoch
    assert "NOISY" in report and "NOISY" in page and reports[1]["measured_epoch"]["noisy"]
    assert not reports[2]["measured_epoch"]["noisy"] and "epochs 1-2, spread 4 %" in page


@pytest.mark.parametrize("times, noisy", [(NOISY, True), (QUIET, False)])
def test_the_lab_pages_what_if_and_compares_report_name_the_noisy_base_and_only_it(tmp_path, times, noisy):
    from handler.profiling.lab.page import summary_row
    from handler.profiling.lab.whatif_folder import lab_section
    one, two = summary(times), summary([12.0, 6.0, 6.0, 6.0])
    rows = [summary_row(s, {"report": s["report"], "mode": "ddp", "gpus": n}) for n, s in ((1, one), (2, two))]
    section = "\n".join(lab_section(rows))
    outcomes = [Outcome(Cell(Variant("ddp", "ddp"), n), "ok", 0, profile=s, folder=f"cells/ddp-n{n}",
                        metrics={"config": {}, "epochs": [{"epoch": 0, "time_s": 1.0, "images_per_s": 1.0, "data_wait_s": 0.0}]})
                for n, s in ((1, one), (2, two))]
    found = build_rows(outcomes)
    add_predictions(found, outcomes)
    write_report(tmp_path, found, {}, {"date": "", "command": "", "code": "", "hardware": {
        "cpu": "", "cores": 2, "memory_gib": 1.0, "gpus": []}, "versions": {
        "python": "", "torch": "", "torchvision": "", "dali": None, "nsys": None}}, {}, "synthetic", True)
    report = (tmp_path / "report.md").read_text()
    spread = "spread 60 %" if noisy else "spread 2 %"
    assert f"its measured epoch 10 s: the median of epochs 1-3, {spread}" in section and spread in report
    assert ("NOISY" in section and "| could move s |" in section) is noisy
    assert ("NOISY" in report and "could move s" in report) is noisy
    assert rows[0]["measured_epoch"]["noisy"] is noisy and not rows[1]["measured_epoch"]["noisy"]
