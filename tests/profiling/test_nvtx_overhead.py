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
