"""bench.gpu's pairing: both modes every round in alternating order, a ddp / ddp_dali ratio
per round, failures kept out of the ratios. Its GPU timing itself needs a GPU."""
import json

import pytest

import bench.gpu as bench_gpu


def test_every_round_runs_both_modes_and_the_first_mode_alternates():
    orders = [bench_gpu.round_order(r) for r in range(4)]
    assert all(sorted(o) == sorted(bench_gpu.MODES) for o in orders)
    assert [o[0] for o in orders] == ["ddp", "ddp_dali", "ddp", "ddp_dali"]


def test_ratios_are_taken_within_each_round_and_a_failed_side_drops_only_its_round():
    rounds = [{"ddp": 12.0, "ddp_dali": 10.0}, {"ddp_dali": 5.0, "ddp": 6.0}, {"ddp": 9.0, "ddp_dali": None}]
    s = bench_gpu.summarise(rounds)
    assert s["ratio_per_round"][:2] == pytest.approx([1.2, 1.2]) and s["ratio_per_round"][2] is None
    # Paired: drift between rounds (the second round runs twice as fast) leaves the ratio alone.
    assert s["ddp_over_ddp_dali"] == pytest.approx(1.2)
    assert [r["order"] for r in s["per_round"]] == [["ddp", "ddp_dali"], ["ddp_dali", "ddp"], ["ddp", "ddp_dali"]]
    assert s["epoch_s"] == {"ddp": 9.0, "ddp_dali": 7.5} and s["samples"]["ddp_dali"] == [10.0, 5.0]
    assert bench_gpu.summarise([{"ddp": None, "ddp_dali": 3.0}])["ddp_over_ddp_dali"] is None


def test_the_bench_runs_three_paired_rounds_and_reports_each_ratio(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_time(mode, out, train_args):
        calls.append((out.name, mode))
        r = int(out.name[len("round"):])
        return (2.0 if mode == "ddp" else 1.0) * (r + 1), 100.0, None  # each round slower than the last

    monkeypatch.setattr(bench_gpu, "context", lambda name: {"load_average_before": [0.0, 0.0, 0.0]})
    monkeypatch.setattr(bench_gpu, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(bench_gpu, "precision_args", lambda: ["--channels-last"])
    monkeypatch.setattr(bench_gpu, "gpu_name", lambda: "NVIDIA H100")
    monkeypatch.setattr(bench_gpu, "time_mode", fake_time)
    data = bench_gpu.main(["--json", str(tmp_path / "gpu.json")])
    assert calls == [("round0", "ddp"), ("round0", "ddp_dali"), ("round1", "ddp_dali"), ("round1", "ddp"),
                     ("round2", "ddp"), ("round2", "ddp_dali")]
    assert data["rounds"] == 3 and len(data["per_round"]) == 3
    assert data["ratio_per_round"] == [2.0, 2.0, 2.0] and data["ddp_over_ddp_dali"] == 2.0
    assert set(data["epoch_s"]) == {"ddp", "ddp_dali"} and not data["failures"]
    text = capsys.readouterr().out
    assert "median of the paired ratios: 2.000" in text and "ddp_dali then ddp" in text
    assert json.loads((tmp_path / "gpu.json").read_text())["ratio_per_round"] == [2.0, 2.0, 2.0]


def test_a_mode_that_fails_is_named_in_failures_and_keeps_out_of_the_rates(monkeypatch, tmp_path):
    # Only the CUDA boundary (cuda_status, the GPU's name and bf16 support) and the training
    # run itself (a GPU run) are replaced; the round bookkeeping is the real one.
    def fake_time(mode, out, train_args):
        return (None, None, "exit 1: out of memory") if mode == "ddp_dali" else (2.0, 100.0, None)

    monkeypatch.setattr(bench_gpu, "context", lambda name: {"load_average_before": [0.0, 0.0, 0.0]})
    monkeypatch.setattr(bench_gpu, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(bench_gpu, "precision_args", lambda: ["--channels-last"])
    monkeypatch.setattr(bench_gpu, "gpu_name", lambda: "NVIDIA H100")
    monkeypatch.setattr(bench_gpu, "time_mode", fake_time)
    data = bench_gpu.main(["--quick", "--json", str(tmp_path / "gpu.json")])
    assert data["failures"] == {"ddp_dali": "exit 1: out of memory"}
    assert data["ddp_over_ddp_dali"] is None and set(data["images_per_s"]) == {"ddp"}


@pytest.mark.gpu
def test_the_quick_bench_times_both_modes_on_a_gpu(tmp_path):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    data = bench_gpu.main(["--quick", "--json", str(tmp_path / "gpu.json")])
    assert not data["failures"], data["failures"]
    assert data["gpu"] and all(data["epoch_s"][mode] > 0 for mode in bench_gpu.MODES)
    assert "--channels-last" in data["precision"] and data["ddp_over_ddp_dali"] > 0


@pytest.mark.gpu
def test_the_loaders_bench_rates_dali_on_the_gpu(tmp_path):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    import bench.loaders as bench_loaders
    data = bench_loaders.main(["--quick", "--json", str(tmp_path / "loaders.json")])
    for source in bench_loaders.SOURCES:
        rate = data["images_per_s"][f"dali-gpu {source} t{bench_loaders.PARALLEL}"]
        assert rate["median"] > 0, source
