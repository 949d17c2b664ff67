"""The host's cores as one resource (handler/profiling/scaling/cores.py): a CPU run's ranks and
loaders share them, from the run's own CPU time; a GPU run's loaders get what the ranks' main
threads leave. Summaries are built as in test_whatif.py."""
from dataclasses import replace

import pytest

from handler.profiling import whatif
from handler.profiling.record.metrics import Metrics
from handler.profiling.record.summary import Machine
from handler.profiling.scaling.cores import cpu_time_of
from handler.profiling.whatif import predictions
from tests.profiling.lab.test_whatif import CPU_1RANK, TA_DDP_1GPU, TA_MEASURED, by_count, summary

TWO_CORES = {"cpu_cores": 2, "cpu_cores_from": "nsys TARGET_INFO_SYSTEM_ENV CpuCores", "loader_workers": 2.0,
             "loader_workers_from": "metrics config.workers", "threads_per_rank": 2,
             "threads_per_rank_from": "metrics env.torch_threads", "rank_cpu_ms": 1400.0,
             "cpu_time_from": "metrics epochs[].cpu_time, the median of 2 epochs after the first"}
# A 1-rank CPU run of 2 threads on 2 cores: a 1000 ms step, 30 ms of it waiting for data, 965 ms computing.
STEP_MS, WAIT_MS, CORES_MS = 1000.0, 30.0, 965.0


def cpu_run(loader_ms: float, **machine) -> dict:
    return {**CPU_1RANK, "machine": {**TWO_CORES, "loader_cpu_ms": loader_ms, **machine}}


def speedup(source: dict, n: int = 2) -> float:
    cells = by_count(predictions(source, (1, n)))
    return cells[1]["epoch_s"] / cells[n]["epoch_s"]


def test_a_dali_like_run_whose_loader_barely_uses_the_cores_predicts_no_gain_from_a_second_rank():
    # ddp_dali on this 2-core box: its DALI threads read 2 ms of CPU a step (bench.cores_matrix)
    assert 0.95 <= speedup(cpu_run(2.0)) <= 1.0  # the second rank adds its all-reduce, and takes nothing off


def test_a_dataloader_workers_cpu_time_stalls_one_rank_of_every_core_and_half_as_much_of_two():
    # 180 ms of workers' CPU a step lands on the cores of the one 2-thread rank: all of it stalls that
    # rank; over 2 ranks of 1 thread each, each loses half. The ring all-reduce comes on top.
    cells = by_count(predictions(cpu_run(180.0), (1, 2)))
    assert cells[1]["step_ms"] == pytest.approx(STEP_MS)  # its own count: as measured
    assert cells[2]["terms_ms"]["cores"] == pytest.approx(CORES_MS - 180.0 + 90.0)
    assert cells[2]["step_ms"] == pytest.approx(WAIT_MS + CORES_MS - 90.0 + cells[2]["terms_ms"]["link"])
    assert speedup(cpu_run(180.0)) > speedup(cpu_run(2.0))  # the mode whose loader shares the cores gains more


def test_a_run_of_a_rank_per_core_predicts_one_rank_of_every_core_stalled_by_all_of_its_loaders():
    two = summary(ranks=2, step_ms=900.0, inside_ms=890.0, data_ms=20.0, h2d_ms=0.0, forward_ms=350.0,
                  backward_ms=520.0, steps=30, epochs=3, comm_s=0.3, exposed_s=0.15, buckets=2,
                  report="nsight_logs/ddp_20261127_120000/gpu_2.nsys-rep")
    machine = {**TWO_CORES, "threads_per_rank": 1, "loader_cpu_ms": 50.0}  # per rank: 100 ms a step in all
    cells = by_count(predictions({**two, "machine": machine}, (1, 2)))
    own = cells[2]["terms_ms"]["cores"]
    assert cells[1]["terms_ms"]["cores"] == pytest.approx(own - 50.0 + 100.0)


@pytest.mark.parametrize("loader_ms", [0.0, 2.0, 180.0, 900.0, 5000.0])
def test_the_own_count_is_measured_and_a_loader_that_keeps_up_is_never_slower(loader_ms):
    for n, c in by_count(predictions(cpu_run(loader_ms), (1, 2, 4, 8))).items():
        assert c["keeps_up_epoch_s"] <= c["epoch_s"] + 1e-9
        assert c["terms_ms"]["cores"] >= 0
        if n == 1:
            assert c["step_ms"] == pytest.approx(STEP_MS)


def test_a_cpu_run_without_cpu_time_says_what_it_assumed_and_takes_other_reports_compute():
    bare = {**CPU_1RANK, "machine": {k: v for k, v in TWO_CORES.items() if k != "rank_cpu_ms"}
            | cpu_time_of(None)}
    text = whatif.facts(predictions(bare, (2,), factors={2: 0.8}))
    assert "| 2: x0.80, held at the other counts | measured by other reports" in text and "not recorded" in text
    assert "assumed" in text
    assert by_count(predictions(bare, (1, 2), factors={2: 0.8}))[2]["terms_ms"]["cores"] == pytest.approx(
        CORES_MS * 0.8)
    recorded = whatif.facts(predictions(cpu_run(45.0), (2,), factors={2: 0.8}))
    # with the run's own CPU time, other reports give only the threads' efficiency at n, on the compute alone
    assert "loader 45 ms and rank 1400 ms of CPU a step per rank" in recorded
    assert "| 2: x0.80 of that share |" in recorded and "the threads' efficiency other reports here measured" in recorded
    held, eff = (by_count(predictions(cpu_run(45.0), (1, 2), factors=f))[2]["terms_ms"]["cores"] for f in ({}, {2: 0.8}))
    assert eff < held  # the stall stays whole: only the compute is scaled


def test_the_machine_block_takes_the_median_cpu_time_of_the_epochs_after_the_first():
    epochs = [{"cpu_time": {"loader_ms_per_step": l, "rank_ms_per_step": r}} for l, r in
              ((90.0, 3000.0), (40.0, 1400.0), (50.0, 1500.0), (45.0, 1450.0))]
    found = cpu_time_of(Metrics.model_validate({"epochs": epochs}))
    assert (found["loader_cpu_ms"], found["rank_cpu_ms"]) == (45.0, 1450.0)
    assert "3 epochs after the first" in found["cpu_time_from"]
    assert cpu_time_of(Metrics.model_validate({"epochs": epochs[:1]}))["loader_cpu_ms"] == 90.0
    assert cpu_time_of(Metrics.model_validate({"epochs": [{"epoch": 0}]}))["loader_cpu_ms"] is None


# The TAs' host: their reports' CpuCores is not at hand. Assumed: 4 DataLoader workers a rank on a
# host of 16 cores (4 a GPU); docs/PROFILING.md ("Worked example") says why and what else would follow.
TA_HOST = {"cpu_cores": 16, "cpu_cores_from": "assumed: 4 cores a GPU", "loader_workers": 4.0,
           "loader_workers_from": "assumed"}


def test_the_tas_4_gpu_ddp_cell_is_within_10_percent_once_the_ranks_main_threads_take_their_cores():
    cells = by_count(predictions({**TA_DDP_1GPU, "machine": TA_HOST}, (1, 2, 4)))
    for n in (2, 4):
        seen = TA_MEASURED[("ddp", n)]
        assert abs(cells[n]["epoch_s"] - seen) / seen <= 0.10, (n, cells[n]["epoch_s"], seen)
    # 4 ranks' main threads leave 12 of 16 cores to 16 workers: the wait shrinks 3x, not 4x
    assert cells[4]["terms_ms"]["loader"] == pytest.approx(cells[1]["terms_ms"]["loader"] / 3)


def test_the_threads_efficiency_is_read_from_other_modes_with_their_own_loaders_taken_out():
    """A folder of CPU reports: one mode's measured compute at 2 ranks over what the cores model gives
    from its 1-rank report is the machine's; a mode whose loader stalls more is not read as slower threads."""
    from handler.profiling.scaling.cores import cpu_parts, efficiency
    from handler.profiling.scaling.step import split_of
    base, machine = split_of(cpu_run(2.0)), Machine.model_validate({**TWO_CORES, "loader_cpu_ms": 2.0})
    compute, stall = cpu_parts(base, 2, machine)
    at_two = split_of({**cpu_run(2.0), "ranks": [dict(cpu_run(2.0)["ranks"][0], rank=r) for r in (0, 1)]})
    scale = (0.8 * compute + stall) / at_two.busy  # a measured 2-rank run whose compute took 0.8 of the model's
    two = replace(at_two, busy=at_two.busy * scale)
    assert efficiency({"other": {1: (base, machine), 2: (two, machine)}}, 1) == {2: pytest.approx(0.8)}
    assert efficiency({"other": {1: (base, machine)}}, 1) == {}
