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


def test_the_nsys_comparison_times_a_plain_and_a_profiled_run(tmp_path):
    # The full bench's last part (skipped by --quick): the same small run with and without nsys.
    from types import SimpleNamespace

    from bench.nvtx_overhead import train_run
    from tests.nsys_helpers import require_nsys
    from tests.parallel import one_at_a_time
    require_nsys()
    args = SimpleNamespace(images=64, epochs=2)
    plain = train_run(False, args, tmp_path)
    with one_at_a_time("nsys"):
        profiled = train_run(True, args, tmp_path)
    assert math.isfinite(plain) and plain > 0 and math.isfinite(profiled) and profiled > 0
    assert len(list(tmp_path.glob("*/run.nsys-rep"))) == 1  # the profiled run wrote its report
