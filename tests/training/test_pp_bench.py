"""bench.pp's comparison of the two splits: speed over one process, the slow stage's
bubble, the paired time / params ratio and the goal on paired rounds, from its own rows
(nothing timed), and its measurement on real ranks."""
import pytest

from bench.pp import _goal, _summarise


def run(split, schedule, m, rate, bubbles):
    return {"split": split, "schedule": schedule, "microbatches": m,
            "ranks": [{"images_per_s": rate, "bubble": b} for b in bubbles]}


def test_the_goal_run_is_the_fastest_time_split_run_against_the_mean_reference():
    runs = [run("params", "1f1b", 8, 480.0, (0.06, 0.60)), run("time", "1f1b", 8, 640.0, (0.12, 0.14)),
            run("params", "1f1b", 4, 500.0, (0.05, 0.55)), run("time", "1f1b", 4, 600.0, (0.20, 0.22))]
    reference = [{"ranks": [{"images_per_s": 380.0}]}, {"ranks": [{"images_per_s": 420.0}]}]
    result = _summarise(runs, reference)
    assert runs[1]["speedup_over_1_process"] == pytest.approx(1.6)  # 640 / mean(380, 420)
    assert runs[0]["slow_stage_bubble"] == pytest.approx(0.06)  # the stage that idles least
    assert result["time_over_params"] == pytest.approx({"1f1b M=8": 640 / 480, "1f1b M=4": 600 / 500})
    assert result["fastest_time_run"] == ("1f1b", 8)


def test_the_goal_takes_the_median_of_the_paired_rounds():
    """One fast round (a quiet stretch for the pipeline only) cannot meet the goal alone."""
    rounds = {"run": "1f1b M=16", "speedups": [1.45, 1.62, 1.48], "slow_stage_bubbles": [0.09, 0.2, 0.12]}
    goal = _goal(rounds)
    assert goal["speedup"]["value"] == pytest.approx(1.48) and not goal["speedup"]["met"]
    assert goal["slow_stage_bubble"]["value"] == pytest.approx(0.12) and goal["slow_stage_bubble"]["met"]
    rounds["speedups"] = [1.51, 1.62, 1.40]
    assert _goal(rounds)["speedup"]["met"]
    rounds["slow_stage_bubbles"] = [0.16, 0.2, 0.12]  # the slow stage idles too long in most rounds
    assert not _goal(rounds)["slow_stage_bubble"]["met"]


@pytest.mark.slow  # bench.pp's runs for one check: CI's slow step (pytest.ini)
def test_a_pipeline_run_and_the_one_process_reference_measure_real_ranks(tmp_path):
    """bench.pp's own measurement (worker, measure, the saved-activation count) on the
    smallest size: one 2-stage 1F1B run and the one-process reference, spawned as in the bench."""
    from bench.pp import measure
    from models import build_model

    size = dict(model="resnet20", batch=4, warmup=1, steps=1)
    whole = sum(p.numel() * p.element_size() for p in build_model("resnet20", 10).parameters())
    piped = measure(2, "1f1b", 2, "params", size, str(tmp_path))
    ranks = piped["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sum(r["param_bytes"] for r in ranks) == whole  # each stage holds its own part only
    assert all(0 < r["param_bytes"] < whole and r["activation_peak_bytes"] > 0 for r in ranks)
    assert all(0 <= r["bubble"] < 1 and r["images_per_s"] > 0 for r in ranks)
    assert piped["split"]["cuts"]  # the cut it trained with is recorded
    reference = measure(1, None, 2, "", size, str(tmp_path), "start")["ranks"]
    assert len(reference) == 1 and reference[0]["param_bytes"] == whole
    assert reference[0]["bubble"] == 0 and reference[0]["activation_peak_bytes"] > 0  # one process never waits
