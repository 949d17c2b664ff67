"""End to end: each mode trains on CPU, writes the metrics of docs/METRICS.md, and learns."""
import pytest

from tests.conftest import N_TEST, PROCESSES, read_metrics
from handler.runtime.phases import LOOP_PHASES

EPOCH_KEYS = {"epoch", "time_s", "train_samples", "train_loss", "train_acc", "images_per_s",
              "data_wait_s", "val_loss", "val_acc", "val_samples"}
ENV_KEYS = {"mode", "world_size", "backend", "device", "gpus", "dataset", "torch", "torchvision",
            "dali", "nsys", "started_at"}


# ddp_dali and fsdp (35 and 44 s, with the runs test_hosts and test_cpu_time share): CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box; every mode
# still trains in the main suite (test_toolbox.py)
@pytest.mark.parametrize("mode", ["dp", "ddp", pytest.param("ddp_dali", marks=pytest.mark.slow), pytest.param("fsdp", marks=pytest.mark.slow)])
def test_mode_trains_two_epochs_writes_metrics_and_learns(mode, two_epoch_run):
    # The same runs are the straight runs the resume tests must reproduce (conftest).
    proc, folder = two_epoch_run(mode)
    m, procs = read_metrics(folder / "metrics.json"), PROCESSES[mode]
    assert m["schema"] == 1
    assert ENV_KEYS <= set(m["env"])
    assert m["env"]["mode"] == mode and m["env"]["world_size"] == procs
    assert m["env"]["dataset"] == "synthetic"
    assert m["config"]["batch_size"] == 64 and m["config"]["dataset"] == "synthetic"
    assert [e["epoch"] for e in m["epochs"]] == [0, 1]
    for e in m["epochs"]:
        assert EPOCH_KEYS <= set(e)
        assert 0 <= e["train_acc"] <= 1 and 0 <= e["val_acc"] <= 1
        assert e["val_samples"] == 100
        assert e["train_samples"] >= 1101  # every training image at least once
        phases = e["phase_s"]  # the loop's own timers, for phase shares without nsys
        assert set(phases) == set(LOOP_PHASES) and min(phases.values()) >= 0
        assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0
        assert 0.5 * e["time_s"] < sum(phases.values()) <= e["time_s"]
    assert m["test"]["samples"] == N_TEST
    assert m["test"]["acc"] > 0.3, "well above the 0.1 of chance"
    assert m["epochs"][1]["train_loss"] < m["epochs"][0]["train_loss"]
    assert m["total_time_s"] > 0
    assert (folder / "last.pt").is_file() and (folder / "best.pt").is_file()
    if mode == "dp" and m["env"]["device"] == "cpu":  # DP without GPUs says so, once, and records it
        assert proc.stdout.count("DP needs GPUs to split work") == 1
        assert any("DP needs GPUs" in n for n in m["env"]["notes"])

