"""Each bench/ script runs in --quick mode and writes its JSON; values are sane, never timed."""
import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_cli, run_process, spawn_within_budget

# One thread per process: quicker on a busy 2-core machine, and these tests time nothing.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
BUDGET = {"loaders": 10, "overhead": 8, "ddp_scaling": 40, "gpu": 8}  # s, measured (conftest)


def run_bench(name, tmp_path) -> dict:
    out = tmp_path / f"{name}.json"
    run = run_cli(["--quick", "--json", out], cmd=[sys.executable, "-m", f"bench.{name}"], cwd=ROOT,
                  env=ONE_THREAD, budget=BUDGET[name])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["bench"] == name and data["quick"] is True
    assert data["context"]["hardware"]["cores"] >= 1 and data["context"]["versions"]["torch"]
    return data


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def rates_are_sane(rates: dict) -> None:
    for name, stats in rates.items():
        assert stats["samples"] and all(positive(s) for s in stats["samples"]), name
        assert stats["min"] <= stats["median"] <= stats["max"], name


@pytest.mark.slow  # 10 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_loaders_bench_rates_every_loader_and_the_dali_ratio(tmp_path):
    data = run_bench("loaders", tmp_path)
    rates = data["images_per_s"]
    assert {"torchvision w0", "torchvision w2", "dali-cpu raw t2", "dali-cpu jpeg t2"} <= set(rates)
    rates_are_sane(rates)
    assert all(positive(r) for r in data["dali_cpu_vs_torchvision"].values())
    assert positive(data["target"]["value"]) and data["target"]["target"] == 4.0


@pytest.mark.slow  # 10 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_overhead_bench_compares_the_harness_loop_to_a_bare_loop(tmp_path):
    data = run_bench("overhead", tmp_path)
    assert set(data["images_per_s"]) == {"harness (ddp, world 1)", "loop, unwrapped", "bare"}
    rates_are_sane(data["images_per_s"])
    assert data["nvtx_active"] is True
    assert data["ratio_to_bare"]["bare"] == pytest.approx(1.0)
    assert positive(data["target"]["value"])
    assert data["steps_per_block"] >= data["steps"] and data["block_s"] > 0


@pytest.mark.slow  # three bench runs for one check: CI's slow step (pytest.ini)
def test_ddp_scaling_bench_measures_three_configurations_and_the_no_allreduce_ceiling(tmp_path):
    data = run_bench("ddp_scaling", tmp_path)
    assert set(data["images_per_s"]) == {"1 rank x 1 thread", "2 ranks x 1 thread", "1 rank x 2 threads",
                                         "2 ranks x 1 thread, no all-reduce"}
    rates_are_sane(data["images_per_s"])
    assert set(data["targets"]) == {"2 ranks x 1 thread / 1 rank x 1 thread",
                                    "2 ranks x 1 thread / 1 rank x 2 threads"}
    assert all(positive(t["value"]) for t in data["targets"].values())
    assert positive(data["ratios"]["2 ranks x 1 thread, no all-reduce / 1 rank x 2 threads"])


# The threads a gloo process group runs: its workers, gloo's socket loop, and (rank 0) the store server.
GROUP_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv")


def ddp_scaling_rank_then_threads(proc_id, world, port, out_dir):
    """One rank of bench.ddp_scaling's 2-rank DDP measurement, then the threads its process
    still runs once the rank has returned, as mp.spawn's exit would find them."""
    from bench import ddp_scaling
    ddp_scaling.worker(proc_id, (world, 1, True, port, ddp_scaling.QUICK, os.path.join(out_dir, "rates.json")))
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    with open(os.path.join(out_dir, f"threads{proc_id}.json"), "w") as f:
        json.dump(names, f)


@pytest.mark.slow  # 16 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_ddp_scaling_ranks_end_their_process_group_before_the_interpreter_exits(tmp_path):
    """The SIGABRT at exit ("terminate called without an active exception", rank 0): DDP's set-up
    imported torch.distributed.nn, whose group.WORLD default arguments kept the group, and with
    it gloo's threads and rank 0's store server, alive past destroy_process_group into exit."""
    from handler.DDP.utils import held_store  # the store the bench's own launcher holds for its ranks
    with held_store("127.0.0.1", 0) as port:
        spawn_within_budget(ddp_scaling_rank_then_threads, (2, port, str(tmp_path)), 2,
                            budget=20, name="bench.ddp_scaling.worker")  # s, measured (45-60 s at load 10)
    for rank in range(2):
        left = json.loads((tmp_path / f"threads{rank}.json").read_text())
        assert not [name for name in left if name in GROUP_THREADS], (rank, left)


def test_gpu_bench_skips_cleanly_without_cuda_or_times_both_modes(tmp_path):
    data = run_bench("gpu", tmp_path)
    if "skipped" in data:
        assert data["skipped"].startswith("skip: bench.gpu needs a CUDA GPU")
    else:
        assert set(data["epoch_s"]) == {"ddp", "ddp_dali"}
        assert all(positive(t) for t in data["epoch_s"].values())


def test_a_ratio_over_zero_is_nan_not_an_error():
    from bench.common import ratio
    assert ratio(3.0, 1.5) == 2.0 and math.isnan(ratio(1.0, 0.0))


# ---- bench/nvtx_overhead.py: the NVTX cost benchmark reports sane numbers (no timing thresholds)
@pytest.mark.slow  # 12 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_nvtx_overhead_quick_reports_per_range_costs(tmp_path):
    out = tmp_path / "nvtx.json"
    run = run_process([sys.executable, "-m", "bench.nvtx_overhead", "--quick", "--json", out], cwd=ROOT, budget=20)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    for key in ("range_ns_off", "range_ns_on", "step_s_resnet20_b128", "share_of_step_off", "share_of_step_on"):
        assert math.isfinite(data[key]) and data[key] > 0, key
    assert data["share_of_step_on"] < 1



@pytest.mark.slow  # a plain and a profiled run for one check: CI's slow step (pytest.ini)
def test_the_nsys_comparison_times_a_plain_and_a_profiled_run():
    # The full bench's last part (skipped by --quick): the same small run with and without nsys.
    from types import SimpleNamespace

    from bench.nvtx_overhead import under_nsys
    from tests.nsys_helpers import NSYS_SESSION_FAILURE, require_nsys
    from tests.parallel import one_at_a_time
    require_nsys()
    results = {}
    with one_at_a_time("nsys"):
        try:
            line = under_nsys(SimpleNamespace(images=64, epochs=2), 1, results)
        except subprocess.CalledProcessError as failed:  # nsys's own session failure: once more
            said = (failed.stdout or b"").decode(errors="replace") + (failed.stderr or b"").decode(errors="replace")
            if not NSYS_SESSION_FAILURE.search(said):
                raise
            print(f"nsys failed its own session ({NSYS_SESSION_FAILURE.search(said).group(0)}); trying once more")
            results.clear()
            line = under_nsys(SimpleNamespace(images=64, epochs=2), 1, results)
    assert results["epoch_s_plain"] > 0 and results["epoch_s_nsys"] > 0
    assert results["nsys_slowdown"] == results["epoch_s_nsys"] / results["epoch_s_plain"]
    assert line.startswith("\nunder nsys: epoch") and results["rounds"]["nsys"] == [results["epoch_s_nsys"]]
