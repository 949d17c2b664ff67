"""The NVTX cost benchmark runs and reports sane numbers (no timing thresholds)."""
import json
import math
import subprocess
import sys

from tests.conftest import ROOT


def test_nvtx_overhead_quick_reports_per_range_costs(tmp_path):
    out = tmp_path / "nvtx.json"
    subprocess.run([sys.executable, "-m", "bench.nvtx_overhead", "--quick", "--json", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    data = json.loads(out.read_text())
    for key in ("range_ns_off", "range_ns_on", "step_s_resnet20_b128", "share_of_step_off", "share_of_step_on"):
        assert math.isfinite(data[key]) and data[key] > 0, key
    assert data["share_of_step_on"] < 1
