"""Issue 55's defects 1 and 2, each on an input shaped as the user's: summaries the old schema took that
crashed the what-if, and the run's facts derived once (scaling/facts.py job_split, scaling/run_facts.py)
from every source: a node's report of a bigger job, pp's micro-batches at one stage, a CPU run's threads."""
import json
import shutil
import subprocess
import sys

import pytest

from handler.profiling import report, whatif
from handler.profiling.bubble import pipeline_stats
from handler.profiling.record.parse import parse_summary
from handler.profiling.scaling.cores import cpu_parts
from handler.profiling.scaling.facts import job_split
from handler.profiling.scaling.run_facts import run_block
from handler.profiling.trace import load_trace
from handler.runtime.errors import UserError
from tests.nsys_helpers import REAL_EXPORTS, REPO, with_training_ranges
from tests.profiling.lab.test_whatif import CPU_1RANK, by_count, summary
from tests.profiling.test_profile_pp_gpu import with_pp_ranges


def cli(path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(path), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_a_machine_block_without_its_sources_is_read_as_not_recorded():
    """Defect 1: a machine block of the numbers alone (no cpu_cores_from, no loader_workers_from): KeyError."""
    bare = {**CPU_1RANK, "machine": {"cpu_cores": 4, "loader_workers": 2.0}}
    text = whatif.facts(whatif.predictions(bare, (1, 2)))
    assert "| CPU cores | 4 | not recorded |" in text and "| loader workers per process | 2 | not recorded |" in text


def test_a_multi_node_cpu_fsdp_job_asked_at_one_count_is_predicted():
    """Defect 1: a 2-node CPU fsdp job of 4 ranks, --gpus 1: AttributeError on a link between nodes never set."""
    job = {**summary(ranks=4, step_ms=900.0, inside_ms=880.0, comm_s=0.5, exposed_s=0.2, steps=30, epochs=3),
           "run": {"mode": "fsdp", "mode_from": "metrics config.mode", "nodes": 2, "gpus_per_node": 0, "processes": 4}}
    found = whatif.predictions(job, (1,))
    assert all(c["epoch_s"] > 0 for c in found["cells"]) and "| nodes | 2 of 2: counts past 2 span nodes |" in whatif.facts(found)


@pytest.mark.parametrize("value", ["four", -1, 0, 2.5])
def test_a_pipeline_entrys_micro_batches_that_are_no_count_are_one_line_and_exit_2(tmp_path, value):
    """Defect 1: `ranks[].pipeline.microbatches` "four" or -1, which the schema did not list: ValueError,
    ZeroDivisionError."""
    pp = summary(ranks=2, step_ms=200.0, inside_ms=200.0, report="nsight_logs/pp_20250930_120000/gpu_2.nsys-rep")
    for r in pp["ranks"]:
        r["pipeline"] = {"stage": r["rank"], "theoretical_bubble_share": 0.2, "span_s": 10.0, "microbatches": value}
    (tmp_path / "pp.summary.json").write_text(json.dumps(pp))
    done = cli(tmp_path / "pp.summary.json")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"ranks[0].pipeline.microbatches is {value!r}, not a whole number from 1 to 1e6" in done.stderr


@pytest.fixture(scope="module")
def node_of_a_job(tmp_path_factory):
    """One node's report (2 ranks, 2 GPUs, the real 2-GPU export) of a 2-node, 4-GPU job, summarised by the
    report with the job's metrics JSON, as scripts/slurm/train.sbatch leaves them."""
    folder = tmp_path_factory.mktemp("node")
    with_training_ranges(REAL_EXPORTS["2026.2"], folder / "src.sqlite", batches=6)
    shutil.copyfile(folder / "src.sqlite", folder / "ddp_gpu2.sqlite")
    metrics = {"config": {"mode": "ddp", "model": "resnet18", "world_size": 4},
               "env": {"nodes": 2, "world_size": 4, "hosts": {"0": "a", "1": "a", "2": "b", "3": "b"}}, "epochs": []}
    (folder / "m.json").write_text(json.dumps(metrics))
    report.main([str(folder / "ddp_gpu2.sqlite"), "--out", str(folder / "out"), "--brief", "--metrics",
                 str(folder / "m.json")])
    return folder / "out" / "ddp_gpu2.summary.json"


def test_one_nodes_report_of_a_two_node_job_says_so_and_predicts_the_job_not_its_node(node_of_a_job):
    """Defect 2: it was called "2 GPUs, its report", and 4 GPUs were predicted faster than the job ran."""
    written = json.loads(node_of_a_job.read_text())
    run = written["run"]
    assert (run["nodes"], run["gpus_per_node"], run["processes"]) == (2, 2, 4)
    assert "this report holds 2 of the job's ranks" in run["nodes_from"]
    found = whatif.predictions(written, (1, 2, 4, 8))
    split = found["split"]
    assert (split.devices, split.processes) == (4, 4)
    assert by_count(found)[4]["step_ms"] == pytest.approx(job_split(parse_summary(written, "s"))[0].step * 1e3)
    lines = whatif.markdown(found, "s", {4: by_count(found)[4]["epoch_s"]})
    assert lines[0].startswith("From s (4 GPUs, ") and "this report holds 2 of the job's ranks" in whatif.facts(found)
    assert any(line.startswith("| 4 GPUs (2 nodes) |") and "its report" in line for line in lines)
    assert not any(line.startswith("| 2 GPUs |") and "its report" in line for line in lines)


def test_a_one_stage_pp_report_keeps_its_micro_batches(tmp_path):
    """Defect 2: a 1-stage pp report counted 8 micro-batches but kept none, so the what-if assumed 4."""
    with_pp_ranges(REAL_EXPORTS["2026.2"], tmp_path / "pp.sqlite")
    trace = load_trace(tmp_path / "pp.sqlite")
    one = trace.processes[:1]
    stage, = pipeline_stats(one, None)
    assert stage["microbatches"] >= 2 and stage["theoretical_bubble_share"] == 0.0
    block = run_block({"ranks": [{"host": None, "pipeline": stage}], "gpus": None})
    assert block["pp_microbatches"] == stage["microbatches"] and block["pp_from"].startswith("report:")
    pp = summary(ranks=1, step_ms=200.0, inside_ms=200.0, report="nsight_logs/pp_20250930_120000/gpu_1.nsys-rep")
    pp["ranks"][0]["pipeline"] = {"stage": 0, "theoretical_bubble_share": 0.0, "span_s": 10.0, "microbatches": 8}
    found = whatif.predictions(pp, (1, 2))
    assert found["split"].pipeline.microbatches == 8 and "| pp micro-batches | 8 |" in whatif.facts(found)
    # at 2 stages the span is (M + 1) / 2 slots of the work over M: 9/16 of it, not 4 micro-batches' 5/8
    assert by_count(found)[2]["terms_ms"]["device" if found["split"].gpu else "cores"] == pytest.approx(
        by_count(found)[1]["terms_ms"]["device" if found["split"].gpu else "cores"] * 9 / 16)


def test_a_cpu_run_whose_threads_are_not_recorded_is_held_at_one_as_the_line_above_the_table_says():
    """Defect 2: CPU time known, threads not: predicted to compute n times faster at n ranks (1.67 s -> 1.07 s
    at 2) while the line above the table said "held at x1.00"."""
    machine = {"cpu_cores": 2, "cpu_cores_from": "nsys TARGET_INFO_SYSTEM_ENV CpuCores", "loader_cpu_ms": 20.0,
               "rank_cpu_ms": 960.0, "cpu_time_from": "metrics epochs[].cpu_time"}
    run = {**CPU_1RANK, "machine": machine}
    found = whatif.predictions(run, (1, 2))
    split, m = found["split"], found["machine"]
    assert cpu_parts(split, 2, m)[0] == pytest.approx(cpu_parts(split, 1, m)[0])  # the compute, held
    text = whatif.facts(found)
    assert "held at x1.00" in text and "threads not recorded" in text
    cells = by_count(found)
    assert cells[2]["epoch_s"] >= 0.9 * cells[1]["epoch_s"]  # not 1.67 s -> 1.07 s


def test_a_summary_that_is_not_an_object_is_one_line():
    with pytest.raises(UserError, match="is not a profile summary"):
        whatif.predictions([1, 2])  # type: ignore[arg-type]
