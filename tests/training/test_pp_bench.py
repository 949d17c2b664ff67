"""bench.pp's comparison of the two splits: speed over one process, the slow stage's
bubble, the paired time / params ratio and the goal, from its own rows (nothing timed)."""
import pytest

from bench.pp import _summarise


def run(split, schedule, m, rate, bubbles):
    return {"split": split, "schedule": schedule, "microbatches": m,
            "ranks": [{"images_per_s": rate, "bubble": b} for b in bubbles]}


def test_goal_is_checked_on_the_fastest_time_split_run_against_the_mean_reference():
    runs = [run("params", "1f1b", 8, 480.0, (0.06, 0.60)), run("time", "1f1b", 8, 640.0, (0.12, 0.14)),
            run("params", "1f1b", 4, 500.0, (0.05, 0.55)), run("time", "1f1b", 4, 600.0, (0.20, 0.22))]
    reference = [{"ranks": [{"images_per_s": 380.0}]}, {"ranks": [{"images_per_s": 420.0}]}]
    result = _summarise(runs, reference)
    assert runs[1]["speedup_over_1_process"] == pytest.approx(1.6)  # 640 / mean(380, 420)
    assert runs[0]["slow_stage_bubble"] == pytest.approx(0.06)  # the stage that idles least
    assert result["time_over_params"] == pytest.approx({"1f1b M=8": 640 / 480, "1f1b M=4": 600 / 500})
    goal = result["goal"]
    assert goal["run"] == "1f1b M=8" and goal["speedup"]["met"] and goal["slow_stage_bubble"]["met"]
    runs[1]["ranks"][0]["bubble"] = runs[1]["ranks"][1]["bubble"] = 0.16  # the slow stage idles too long
    assert not _summarise(runs, reference)["goal"]["slow_stage_bubble"]["met"]
