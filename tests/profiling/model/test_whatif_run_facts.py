"""The what-if reads the run's own facts (the summary's `run` block and machine.rank_cores, written
by handler/profiling/analysis.py and merge.py) before anything it guessed from the report's shape
or name: each test is a run a user brought that was predicted wrong before (issue #49)."""
import json
import re
import subprocess
import sys

import pytest

from handler.compare.predict import add_predictions
from handler.compare.results import build_rows
from handler.profiling import whatif
from handler.profiling.scaling.links import FAST_NODE_LINK, NODE_LINK, P2P_LINK
from handler.profiling.whatif import predictions
from handler.runtime.errors import UserError
from tests.nsys_helpers import REPO
from tests.profiling.lab.test_whatif import CPU_1RANK, _outcome, TA_DDP_1GPU, TA_DP_1GPU, by_count, summary


def run_block(mode, *, nodes=1, per_node=1, processes=1, model="resnet18", grad_mb=44.696, stages=None, micro=None):
    """The summary's `run` block as CONTRACT.md (docs/summary.schema.json) gives it."""
    return {"mode": mode, "mode_from": "metrics config.mode", "model": model, "model_from": "metrics config.model",
            "grad_mb": grad_mb, "grad_mb_from": "metrics model.grad_mb", "nodes": nodes, "gpus_per_node": per_node,
            "processes": processes, "pp_stages": stages, "pp_microbatches": micro,
            "pp_from": "metrics config.microbatches" if micro else None}


def two_node_job(nccl_ms=45.0):
    """`report A.sqlite B.sqlite`: a ddp job of 2 nodes x 2 GPUs, merged (merge.py): 4 ranks, their GPUs
    with their hosts, the run block saying 2 nodes of 2 GPUs."""
    job = summary(ranks=4, busy_ms=60.0, step_ms=200.0, inside_ms=120.0, comm_s=98 * nccl_ms / 1e3,
                  exposed_s=98 * 0.02, nccl_ms=nccl_ms, report=["A.nsys-rep", "B.nsys-rep"])
    for g in job["gpus"]:
        g["host"] = "node-a" if g["device"] < 2 else "node-b"
    return {**job, "job": True, "run": run_block("ddp", nodes=2, per_node=2, processes=4)}


def test_a_job_of_two_nodes_is_predicted_as_gpus_with_one_link_within_a_node_and_one_between():
    found = predictions(two_node_job(), (1, 2, 4, 8))
    cells = by_count(found)
    assert found["split"].gpu and found["split"].devices == 4 and found["mode"] == "ddp"
    assert cells[4]["step_ms"] == pytest.approx(200.0)  # its own count: as measured
    # its NCCL kernels measured the ring across the nodes: the link between them; within a node: assumed
    assert "between nodes" in found["between"].source and not found["between"].assumed
    assert found["link"] == P2P_LINK and found["through_host"] is not None
    assert found["nodes"].at(2) == 1 and found["nodes"].at(8) == 4
    # 2 GPUs on one node ride the fast link; 8 over 4 nodes ride the slow one between them
    assert cells[2]["comm_ms"] < 10.0 < 40.0 < cells[8]["comm_ms"]
    table = "\n".join(whatif.markdown(found, "A+B"))
    assert "From A+B (4 GPUs, 98 steps an epoch)" in table and "CPU process" not in table
    assert "| 8 GPUs (4 nodes) |" in table and "| nodes | 2 of 2: counts past 2 span nodes | run.nodes |" in table


def test_a_job_whose_report_measured_no_link_between_nodes_assumes_one_and_says_so_in_a_column():
    found = predictions(two_node_job(nccl_ms=0.0), (2, 4, 8))
    assert found["between"] == NODE_LINK
    table = "\n".join(whatif.markdown(found, "A+B"))
    assert "nodes at 100 Gbit/s s" in table and FAST_NODE_LINK.source[9:] in table
    assert NODE_LINK.source in table
    assert by_count(found)[8]["comm_ms"] > by_count(predictions(two_node_job(nccl_ms=0.0), (8,),
                                                                between=FAST_NODE_LINK))[8]["comm_ms"]


def test_a_job_on_gpus_whose_summary_lost_its_gpus_is_one_line_not_cpu_processes():
    """merge.py's job summary once kept no `gpus`: a 2-node GPU job came out as 4 CPU processes, CPU-bound."""
    job = {**two_node_job(), "gpus": []}
    with pytest.raises(UserError, match=r"^the run ran on GPUs \(run.gpus_per_node 2\) but its summary holds no "):
        predictions(job)


def dp_four_gpus():
    """One process on 4 GPUs, 100 ms of compute per GPU a step, 15 ms of its exchange booked to the link."""
    dp = summary(ranks=4, busy_ms=100.0, step_ms=180.0, inside_ms=80.0, comm_s=98 * 0.015, exposed_s=98 * 0.015,
                 report="nsight_logs/dp_20261128_120000/gpu_4.nsys-rep")
    return {**dp, "ranks": dp["ranks"][:1], "run": run_block("dp", per_node=4)}


def test_dp_at_fewer_gpus_keeps_its_compute_per_gpu_and_has_no_exchange_at_one():
    found = predictions(dp_four_gpus(), (1, 2, 4))
    cells, slow = by_count(found), {c["count"]: c for c in found["through_host"]}
    assert slow[2]["epoch_s"] >= 98 * 0.200 and cells[2]["epoch_s"] >= 98 * 0.200  # 2 GPUs: 200 ms of compute
    assert cells[1]["terms_ms"]["device"] == pytest.approx(400.0) and slow[1]["terms_ms"]["device"] == pytest.approx(400.0)
    assert cells[1]["terms_ms"]["link"] == 0.0 and cells[1]["comm_ms"] == 0.0  # one GPU: nothing to exchange
    assert cells[4]["step_ms"] == pytest.approx(180.0)


def pp_one_stage(micro):
    pp = summary(step_ms=200.0, inside_ms=190.0, data_ms=10.0, h2d_ms=0.0, report="runs/pp/gpu_1.nsys-rep")
    pp["ranks"][0]["pipeline"] = {"stage": 0, "theoretical_bubble_share": 0.0, "span_s": 0.18 * 98}
    return {**pp, "run": run_block("pp", per_node=0, stages=1, micro=micro)} if micro else pp


def test_pp_from_one_stage_speeds_up_with_more_stages_from_its_recorded_micro_batches():
    cells = by_count(predictions(pp_one_stage(8), (1, 2, 4)))
    assert cells[1]["step_ms"] > cells[2]["step_ms"] > cells[4]["step_ms"]
    own = cells[1]["terms_ms"]["cores"]
    assert cells[2]["terms_ms"]["cores"] == pytest.approx(own * (9 / 2) / 8)  # (M + W - 1) / W of M slots
    said = whatif.facts(predictions(pp_one_stage(8), (2,)))
    assert "| pp micro-batches | 8 | run.pp_microbatches" in said
    older = predictions(pp_one_stage(None), (1, 2))  # an older summary: no run block, one stage's bubble is 0
    assert by_count(older)[2]["step_ms"] < by_count(older)[1]["step_ms"]
    assert "| pp micro-batches | 4 | not recorded: the harness default assumed |" in whatif.facts(older)


def test_the_link_reports_bytes_are_its_own_gradients_never_the_predicted_runs_grad_mb(tmp_path):
    """--grad-mb 2000 is the predicted run's; the --link report sent its own 44.7 MB a step in 45 ms."""
    two = {**summary(ranks=2, busy_ms=60.0, nccl_ms=45.0, step_ms=200.0, inside_ms=100.0),
           "run": run_block("ddp", per_node=2, processes=2)}
    (tmp_path / "x.summary.json").write_text(json.dumps(TA_DDP_1GPU))
    (tmp_path / "y.summary.json").write_text(json.dumps(two))
    done = subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(tmp_path / "x.summary.json"),
                           "--gpus", "2", "--grad-mb", "2000", "--link", str(tmp_path / "y.summary.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| link | 7.95 Gbit/s" in done.stdout and "| sent a step | 2e+03 MB (fp32) | --grad-mb |" in done.stdout


def test_the_mode_comes_from_the_run_before_the_name_and_the_name_last_says_so():
    """compare's layout names a 1-GPU dp cell `cells/dp-n1/dp-n1.nsys-rep`: before, predicted as ddp."""
    cell = {**TA_DP_1GPU, "report": "cells/dp-n1/dp-n1.nsys-rep"}
    recorded = predictions({**cell, "run": run_block("dp")}, (2,))
    assert recorded["mode"] == "dp" and by_count(recorded)[2]["epoch_s"] == pytest.approx(31.10, abs=0.01)
    assert "| mode | dp | run.mode (metrics config.mode) |" in whatif.facts(recorded)
    named = predictions(cell, (2,))
    assert named["mode"] == "dp" and "| the file name (dp...; the run recorded no mode) |" in whatif.facts(named)
    # the run's record wins over a misleading name
    assert predictions({**TA_DDP_1GPU, "run": run_block("dp")}, (2,))["mode"] == "dp"


def test_compare_predicts_fsdp_with_its_one_and_a_half_times_the_gradients_as_the_lab_page_does():
    outcomes = [_outcome("fsdp", 1, 10.0, CPU_1RANK), _outcome("fsdp", 2, 11.0, None)]
    rows = build_rows(outcomes)
    add_predictions(rows, outcomes)
    two = next(r for r in rows if r.count == 2)
    lab = by_count(predictions(CPU_1RANK, (1, 2), grad_mb=whatif.GRAD_MB["resnet20"], mode="fsdp"))
    ddp = by_count(predictions(CPU_1RANK, (1, 2), grad_mb=whatif.GRAD_MB["resnet20"], mode="ddp"))
    assert two.predicted_epoch_s == pytest.approx(10.0 * lab[2]["step_ms"] / lab[1]["step_ms"])
    assert lab[2]["comm_ms"] > ddp[2]["comm_ms"]


def test_the_ranks_cores_win_over_the_hosts():
    """A run pinned to 2 of the host's 18 cores: its loaders share 2, so past 2 GPUs the wait stops shrinking."""
    machine = {"cpu_cores": 18, "cpu_cores_from": "nsys TARGET_INFO_SYSTEM_ENV CpuCores", "rank_cores": 2,
               "rank_cores_from": "metrics env.cpu_cores (the affinity)", "loader_workers": 0.0,
               "loader_workers_from": "metrics config.workers"}
    found = predictions({**TA_DDP_1GPU, "machine": machine}, (1, 2, 4))
    wait = {n: by_count(found)[n]["terms_ms"]["loader"] for n in (1, 2, 4)}
    assert wait[2] == pytest.approx(wait[1] / 2) and wait[4] == pytest.approx(wait[2])
    assert ("| CPU cores | 2 (the host has 18) | the ranks' cores, metrics env.cpu_cores (the affinity) |"
            in whatif.facts(found))



def test_the_link_is_read_from_the_gpu_whose_nccl_kernels_waited_least():
    """NCCL kernels spin until every rank arrives: on a loader-bound 2-GPU run GPU 0's took 45 ms a step
    waiting for rank 1's batch, GPU 1's (the last to arrive) 10 ms. The link is the 10 ms one's."""
    two = summary(ranks=2, busy_ms=60.0, nccl_ms=45.0, step_ms=200.0, inside_ms=100.0)
    two["gpus"][1]["nccl_kernel_s"] = 98 * 0.010
    assert predictions(two, (2,))["link"].gbit == pytest.approx(44.696 * 8 / (10.0 - 0.02), rel=1e-6)


def test_a_link_from_a_job_of_two_nodes_is_taken_as_the_link_between_nodes(tmp_path):
    """`--link job.summary.json` of a 2-node job: its ring crossed the nodes, so its rate is the link between
    them; a 1-GPU report predicted at 4 GPUs spans 2 nodes of 2 and rides it, at 2 GPUs it stays in one node."""
    (tmp_path / "job.summary.json").write_text(json.dumps(two_node_job()))
    (tmp_path / "one.summary.json").write_text(json.dumps(TA_DDP_1GPU))
    link, per_node = whatif.link_argument(str(tmp_path / "job.summary.json"))
    assert per_node == 2 and link.gbit == pytest.approx(1.5 * 44.696 * 8 / (45.0 - 0.06), rel=1e-6)
    found = predictions(TA_DDP_1GPU, (2, 4), between=link, per_node=per_node)
    cells = by_count(found)
    assert found["link"] == P2P_LINK and cells[4]["comm_ms"] > 5 * cells[2]["comm_ms"]
    done = subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(tmp_path / "one.summary.json"),
                           "--gpus", "2,4", "--link", str(tmp_path / "job.summary.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| 4 GPUs (2 nodes) |" in done.stdout and "as many GPUs per node as the --link job's nodes held" in done.stdout


@pytest.mark.parametrize("field, value", [("pp_stages", 1e-300), ("nodes", 0), ("pp_microbatches", 2.5),
                                          ("grad_mb", 0), ("gpus_per_node", "two")])
def test_a_run_block_field_that_is_no_count_or_size_is_one_line(field, value):
    """Before: pp_stages 1e-300 was read as 0 stages and ended in a ZeroDivisionError traceback."""
    bent = {**pp_one_stage(4), "run": {**run_block("pp", per_node=0, stages=1, micro=4), field: value}}
    with pytest.raises(UserError, match=rf"run\.{field} is {re.escape(repr(value))}, not a ") as err:
        predictions(bent)
    assert len(str(err.value).splitlines()) == 1


def test_the_cli_says_a_bad_run_block_field_in_one_line_and_exit_2(tmp_path):
    bent = {**pp_one_stage(4), "run": {**run_block("pp", per_node=0, stages=1, micro=4), "pp_stages": 1e-300}}
    (tmp_path / "bent.summary.json").write_text(json.dumps(bent))
    done = subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(tmp_path / "bent.summary.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "run.pp_stages is 1e-300, not a whole number from 1 to 1e6" in done.stderr and "Traceback" not in done.stderr
