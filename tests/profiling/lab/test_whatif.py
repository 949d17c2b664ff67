"""What-if (handler/profiling/whatif.py): the step split by resource and scaled to other counts,
from a summary JSON alone; and handler.compare's predicted and measured epochs.

Summaries are built to the contract of docs/PROFILING.md (ranks[].loop, ranks[].comm, gpus);
the worked example is the TAs' DDP run on 1 RTX 3090 (issue #34)."""
import json
import subprocess
import sys

import pytest

from handler.compare.cells import Cell, Variant
from handler.compare.predict import add_predictions, gradient_mb
from handler.compare.provenance import provenance
from handler.compare.report import write_report
from handler.compare.results import build_rows
from handler.compare.runner import Outcome
from handler.profiling import whatif
from handler.profiling.whatif import Link, base_of, predictions
from tests.nsys_helpers import REPO


def summary(*, ranks=1, steps=98, epochs=1, step_ms=332.8074, inside_ms=33.6679, data_ms=0.0, h2d_ms=0.0849,
            forward_ms=11.3796, backward_ms=22.0546, busy_ms=None, comm_s=None, exposed_s=0.0, buckets=3,
            report="nsight_logs/ddp_20250930_120000/gpu_1.nsys-rep") -> dict:
    """A summary JSON as the report writes it; defaults: the TAs' DDP 1-GPU run."""
    epochs_s = step_ms * steps / 1e3
    loop = {"epochs_s": epochs_s, "steps": steps, "step_mean_ms": step_ms, "inside_steps_ms": inside_ms,
            "between_steps_ms": step_ms - inside_ms,
            "phase_ms": {"data": data_ms, "h2d": h2d_ms, "forward": forward_ms, "backward": backward_ms,
                         "optimizer": None}}
    comm = None if comm_s is None else {"source": "allreduce ranges", "seconds": comm_s, "exposed_s": exposed_s,
                                        "buckets": buckets, "allreduce_ranges": buckets * steps}
    gpus = [] if busy_ms is None else [
        {"device": d, "kernel_busy_share": busy_ms * steps / 1e3 / epochs_s, "compute_busy_share":
         busy_ms * steps / 1e3 / epochs_s, "kernel_busy_s": busy_ms * steps / 1e3, "epochs_s": epochs_s,
         "nccl_kernel_s": 0.0, "memcpy": {}, "peak_memory_mb": None, "metrics": {}} for d in range(ranks)]
    rank = {"epochs": [{"epoch": e, "time_s": epochs_s / epochs} for e in range(epochs)], "loop": loop, "comm": comm}
    return {"schema": 1, "report": report, "overall": {"epoch_mean_s": epochs_s / epochs, "gpu_phase_shares": None,
                                                    "phase_shares": {"forward": forward_ms / step_ms}},
            "ranks": [{**rank, "rank": r} for r in range(ranks)], "gpus": gpus}


TA_DDP_1GPU = summary(busy_ms=97.0375)  # 98 steps of 332.8 ms, 299.1 ms between steps, 97.0 ms of compute
CPU_1RANK = summary(step_ms=1000.0, inside_ms=990.0, data_ms=20.0, h2d_ms=0.0, forward_ms=380.0, backward_ms=580.0,
                    steps=30, epochs=3, comm_s=0.3, exposed_s=0.15, buckets=2,
                    report="nsight_logs/ddp_20261127_120000/gpu_1.nsys-rep")


def by_count(found: dict) -> dict:
    return {c["count"]: c for c in found["cells"]}


def test_the_worked_example_the_tas_ddp_run_on_one_rtx_3090_predicts_two_and_four_gpus():
    """docs/PROFILING.md quotes these numbers: a change to the model changes them."""
    cells = by_count(predictions(TA_DDP_1GPU, (1, 2, 4)))
    assert cells[1]["epoch_s"] == pytest.approx(32.62, abs=0.01)  # the report's own epoch, reproduced
    assert cells[2]["epoch_s"] == pytest.approx(17.95, abs=0.01)  # measured by the TAs: 17.66 s
    assert cells[4]["epoch_s"] == pytest.approx(10.62, abs=0.01)  # measured: 13.56 s (host cores, docs)
    assert [cells[n]["keeps_up_epoch_s"] for n in (1, 2, 4)] == pytest.approx([9.51, 4.75, 3.29], abs=0.01)
    assert [cells[n]["bound"] for n in (1, 2, 4)] == ["loader (host CPU cores)"] * 3


def test_more_ranks_never_predict_less_all_reduce_time_on_the_same_link():
    for source in (TA_DDP_1GPU, CPU_1RANK, summary(ranks=2, busy_ms=50.0, comm_s=0.5, exposed_s=0.1)):
        for link in (None, Link(1.0, 100.0), Link(100.0, 1.0)):
            comm = [by_count(predictions(source, range(1, 17), link))[n]["comm_ms"] for n in range(1, 17)]
            assert comm == sorted(comm), (source["report"], link, comm)


def test_a_cpu_run_with_two_ranks_on_two_cores_shares_the_cores_so_its_compute_does_not_halve():
    cells = by_count(predictions(CPU_1RANK, (1, 2)))
    assert cells[2]["terms_ms"]["cores"] == cells[1]["terms_ms"]["cores"]  # one host's cores, whatever the ranks
    assert cells[2]["terms_ms"]["loader"] == cells[1]["terms_ms"]["loader"]  # the loaders share them too
    assert cells[2]["step_ms"] >= cells[1]["step_ms"]  # plus a ring all-reduce that one rank did not have
    assert cells[1]["step_ms"] == pytest.approx(1000.0)  # the report's own step, reproduced
    assert cells[2]["bound"] == "host cores (compute)"


def test_each_cell_names_the_resource_that_bounds_it():
    gpu_bound = by_count(predictions(summary(step_ms=110.0, inside_ms=100.0, busy_ms=100.0), (1, 8)))
    assert gpu_bound[1]["bound"] == "GPU"
    assert gpu_bound[8]["bound"] == "kernel launches (host)"  # 12.5 ms of GPU work, 100 ms of launches
    slow_link = by_count(predictions(TA_DDP_1GPU, (2,), Link(0.1, 10.0)))
    assert slow_link[2]["bound"] == "link (all-reduce)"
    dp = by_count(predictions(TA_DDP_1GPU, (2,), one_process=True))
    assert dp[2]["terms_ms"]["loader"] == pytest.approx(299.22, abs=0.01)  # one process, one loader (+ h2d)
    assert dp[2]["comm_ms"] == 0.0


def test_a_report_of_several_ranks_gives_the_link_its_rate_from_its_own_all_reduce():
    found = predictions(summary(ranks=2, busy_ms=50.0, comm_s=98 * 0.010, exposed_s=0.0, buckets=3), (2, 4))
    assert found["link"].source == "from the report's all-reduce ranges"
    assert by_count(found)[2]["comm_ms"] == pytest.approx(10.0, rel=0.05)  # its own all-reduce, about reproduced
    assert whatif.is_one_process({"report": "nsight_logs/dp_20251001_173345/gpu_2.nsys-rep"})
    assert not whatif.is_one_process({"report": "nsight_logs/ddp_20251001_173345/gpu_2.nsys-rep"})


def test_each_models_gradient_size_is_its_own_counted_parameters():
    from models import build_model
    for name, mb in whatif.GRAD_MB.items():
        assert sum(p.numel() for p in build_model(name, 10).parameters()) * 4 / 1e6 == pytest.approx(mb, abs=0.001), name
    assert gradient_mb({"config": {"model": "resnet18"}}) == pytest.approx(whatif.RESNET18_GRAD_MB, abs=0.001)
    assert gradient_mb({"config": {"model": "resnet20"}}) == whatif.GRAD_MB["resnet20"]


def test_whatif_runs_from_a_summary_json_alone_without_importing_torch(tmp_path):
    path = tmp_path / "gpu_1.summary.json"
    path.write_text(json.dumps(TA_DDP_1GPU))
    code = ("import sys; from handler.profiling.whatif import main; main([sys.argv[1], '--gpus', '2,4']); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch')")
    done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("no torch")
    assert "| 2 GPUs | 17.95 |" in done.stdout and "| 4 GPUs | 10.62 |" in done.stdout
    assert "loader (host CPU cores)" in done.stdout and "Model (handler/profiling/whatif.py)" in done.stdout


@pytest.mark.parametrize("args, says", [
    (["missing.summary.json"], "does not exist"),
    (["{not}"], "is not JSON"),
    (["{list}"], "is not a profile summary"),
    (["{ok}", "--gpus", "2,x"], "--gpus '2,x' is not a list"),
    (["{ok}", "--link", "10"], "--link '10' is not RATE,LATENCY"),
    (["{ok}", "--link", "0,5"], "--link '0,5' is not RATE,LATENCY"),
])
def test_bad_input_gets_one_line_and_exit_2(tmp_path, args, says):
    files = {"{not}": "garbage", "{list}": "[1, 2]", "{ok}": json.dumps(TA_DDP_1GPU)}
    for key, text in files.items():
        (tmp_path / f"{key.strip('{}')}.json").write_text(text)
    argv = [str(tmp_path / f"{a.strip('{}')}.json") if a in files else a for a in args]
    done = subprocess.run([sys.executable, "-m", "handler.profiling.whatif", *argv], cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr


def _outcome(mode: str, count: int, epoch_s: float, profile: dict | None) -> Outcome:
    epochs = [{"time_s": epoch_s * 1.5, "images_per_s": 1.0, "data_wait_s": 0.0}] + \
             [{"time_s": epoch_s, "images_per_s": 1.0, "data_wait_s": 0.0}] * 2
    return Outcome(Cell(Variant(mode, mode), count), "ok", 0, metrics={"config": {"model": "resnet20"}, "epochs": epochs},
                   profile=profile, folder=f"cells/{mode}-n{count}")


def test_compare_predicts_each_cell_from_its_variants_fewest_processes_into_results_json(tmp_path):
    outcomes = [_outcome("ddp", 1, 10.0, CPU_1RANK), _outcome("ddp", 2, 11.0, None),
                _outcome("dp", 1, 8.0, summary(report="x/dp_1/gpu_1.nsys-rep", step_ms=500.0, inside_ms=490.0))]
    rows = build_rows(outcomes)
    add_predictions(rows, outcomes)
    write_report(tmp_path, rows, {}, provenance("python -m handler.compare --lab"), {}, "synthetic", True)
    cells = {c["name"]: c for c in json.loads((tmp_path / "results.json").read_text())["cells"]}
    two = cells["ddp x2"]
    assert two["measured_epoch_s"] == 11.0 and two["predicted_from"] == "ddp x1"
    # the base's measured epoch (10 s) times the model's step at 2 over its step at 1
    found = by_count(predictions(CPU_1RANK, (1, 2), grad_mb=gradient_mb({"config": {"model": "resnet20"}})))
    assert two["predicted_epoch_s"] == pytest.approx(10.0 * found[2]["step_ms"] / found[1]["step_ms"])
    assert two["prediction_error"] == pytest.approx((two["predicted_epoch_s"] - 11.0) / 11.0)
    assert two["predicted_bound"] == "host cores (compute)"
    assert cells["ddp x1"]["measured_epoch_s"] == 10.0 and cells["ddp x1"]["predicted_epoch_s"] is None
    assert cells["dp x1"]["predicted_epoch_s"] is None  # alone in its variant: nothing to predict
    page = (tmp_path / "report.md").read_text()
    assert "## Predicted from the fewest processes" in page and "| ddp x2 | ddp x1 |" in page
    assert "Median absolute error" in page


def test_the_lab_page_section_predicts_each_mode_from_its_report_on_the_fewest_gpus():
    rows = [{"mode": "ddp", "gpus": n, "epoch_s": s["overall"]["epoch_mean_s"], "ranks": s["ranks"],
             "gpu_table": s["gpus"], "report": s["report"]}
            for n, s in ((1, TA_DDP_1GPU), (2, summary(ranks=2, step_ms=180.2, inside_ms=33.0, busy_ms=51.7)))]
    lines = whatif.lab_section(rows)
    assert "## What-if: the next run, predicted" in lines and whatif.ASSUMPTIONS in lines
    two = next(line for line in lines if line.startswith("| 2 GPUs |"))
    assert two.startswith("| 2 GPUs | 17.95 | 17.66 | +2 % |")
    assert any(line.startswith("| 1 GPU | 32.62 | 32.62 | its report |") for line in lines)
    assert any(line.startswith("From the ddp report (1 GPU, 98 steps an epoch)") for line in lines)


def test_the_lab_page_of_real_exports_carries_the_what_if_section(tmp_path):
    from handler.profiling.lab.page import write_lab
    from tests.nsys_helpers import REAL_EXPORTS
    from tests.profiling.lab.kit_exports import with_kit_ranges
    source = REAL_EXPORTS[sorted(REAL_EXPORTS)[0]]
    entries = []
    for n in (1, 2):
        with_kit_ranges(source, tmp_path / f"ddp_{n}.sqlite")
        entries.append({"report": tmp_path / f"ddp_{n}.sqlite", "mode": "ddp", "gpus": n})
    page = write_lab(entries, tmp_path / "lab")
    assert "## What-if: the next run, predicted" in page and "### ddp" in page
    assert "| 8 GPUs |" in page
