"""The NVTX cost benchmark runs and reports sane numbers (no timing thresholds)."""
import json
import math
import sys

from tests.conftest import ROOT, run_process


def test_nvtx_overhead_quick_reports_per_range_costs(tmp_path):
    out = tmp_path / "nvtx.json"
    run = run_process([sys.executable, "-m", "bench.nvtx_overhead", "--quick", "--json", out], cwd=ROOT, budget=20)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    for key in ("range_ns_off", "range_ns_on", "step_s_resnet20_b128", "share_of_step_off", "share_of_step_on"):
        assert math.isfinite(data[key]) and data[key] > 0, key
    assert data["share_of_step_on"] < 1



def test_the_nsys_comparison_times_a_plain_and_a_profiled_run():
    # The full bench's last part (skipped by --quick): the same small run with and without nsys.
    from types import SimpleNamespace

    from bench.nvtx_overhead import under_nsys
    from tests.nsys_helpers import require_nsys
    from tests.parallel import one_at_a_time
    require_nsys()
    results = {}
    with one_at_a_time("nsys"):
        line = under_nsys(SimpleNamespace(images=64, epochs=2), 1, results)
    assert results["epoch_s_plain"] > 0 and results["epoch_s_nsys"] > 0
    assert results["nsys_slowdown"] == results["epoch_s_nsys"] / results["epoch_s_plain"]
    assert line.startswith("\nunder nsys: epoch") and results["rounds"]["nsys"] == [results["epoch_s_nsys"]]
