"""The analysis at scale: tiled exports (bench/profile_tile.py) and numbers kept bit for bit.

golden_summaries.json holds what the analysis computed before it was rewritten to scale
(tests/profiling/scale_inputs.py says how it was made); the rewrite must give the same.
"""
import json

import pytest

from bench.profile_tile import tile
from handler.profiling.analysis import summarize
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS
from tests.profiling.scale_inputs import GOLDEN, summaries


# Keys added after the golden file was written (docs/PROFILING.md, "Any training profile"): each
# summary must hold them, and everything else must equal the golden file bit for bit.
ADDED = {"convention", "gpus", "model", "run", "measured_epoch"}
ADDED_PER_RANK = {"setup", "setup_libraries", "loop", "nccl_ranges"}


def test_summaries_of_the_real_exports_equal_the_old_analysis_bit_for_bit(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    now = summaries(tmp_path)
    assert sorted(now) == sorted(golden)
    for name in golden:
        assert ADDED <= set(now[name]) and all(ADDED_PER_RANK <= set(r) for r in now[name]["ranks"])
        old = {k: v for k, v in now[name].items() if k not in ADDED}
        old["ranks"] = [{k: v for k, v in r.items() if k not in ADDED_PER_RANK} for r in old["ranks"]]
        assert not differences(old, golden[name]), (name, differences(old, golden[name])[:10])
        assert now[name]["convention"] == "ours"


def differences(a, b, at="") -> list[str]:
    """Paths where two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b and type(a) is type(b) else [f"{at}: {a!r} != {b!r}"]


@pytest.mark.parametrize("copies", [2, 5])
def test_a_tiled_export_has_exactly_k_times_the_kernel_seconds(tmp_path, copies):
    one = summarize(load_trace(_tiled(tmp_path / "one.sqlite", 1)))
    many = summarize(load_trace(_tiled(tmp_path / "many.sqlite", copies)))
    for a, b in zip(one["ranks"], many["ranks"]):
        assert a["gpu"]["kernels"] * copies == b["gpu"]["kernels"]
        assert round(b["gpu"]["kernel_time_s"] * 1e9) == copies * round(a["gpu"]["kernel_time_s"] * 1e9)
        assert round(b["gpu"]["nccl_time_s"] * 1e9) == copies * round(a["gpu"]["nccl_time_s"] * 1e9)
    assert len(many["ranks"]) == len(one["ranks"]) == 2


def _tiled(path, copies):
    tile(REAL_EXPORTS["2026.2"], path, copies=copies, epochs=1, batches=4 * copies)
    return path


@pytest.mark.slow  # an end-to-end run of 13-17 s: CI's slow step (the main run's 10 minutes)
def test_bench_profile_scale_quick_runs_old_and_new_side_by_side(tmp_path):
    """bench.profile_scale --quick: sizes 1 and 2, this checkout against HEAD's code (git archive);
    both must print the same summary. Numbers are not timed here."""
    import subprocess
    import sys

    from tests.nsys_helpers import REPO
    out = tmp_path / "scale.json"
    run = subprocess.run([sys.executable, "-m", "bench.profile_scale", "--quick", "--ref", "HEAD", "--json", str(out)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    sizes = json.loads(out.read_text())["sizes"]
    assert [s["copies"] for s in sizes] == [1, 2]
    assert sizes[1]["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"] == 2 * sizes[0]["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"]
    for size in sizes:
        assert size["same_summary"] and size["new"]["line"].startswith("profile: ")
        assert size["new"]["peak_mb"] > 0 and size["old"]["peak_mb"] > 0 and size["new"]["seconds"] > 0
