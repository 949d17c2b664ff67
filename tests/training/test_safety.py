"""A run never destroys good state: a diverging run stops before it saves,
a fresh start never replaces an earlier run's checkpoints, and emulated bf16 is named."""
import hashlib
import shutil

import pytest
import torch

from handler.runtime.precision import cpu as cpu_precision
from handler.train.divergence import Diverged, DivergenceGuard
from tests.conftest import SMALL, error_lines, read_metrics, run_cli

COMMON = ["--epochs", 1, "--batch-size", 64, "--valid-size", 0, *SMALL]


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def earlier_run(two_epoch_run, tmp_path_factory):
    """A finished run's folder with a good last.pt: a copy of the session's two-epoch ddp
    run (these tests write over it on purpose; the original stays for other tests)."""
    folder = tmp_path_factory.mktemp("earlier") / "ddp"
    shutil.copytree(two_epoch_run("ddp")[1], folder)
    return folder


def test_a_fresh_start_over_an_earlier_run_stops_in_one_line_and_keeps_it(earlier_run, data_root):
    before = digest(earlier_run / "last.pt")
    proc = run_cli(["--mode", "ddp", "--num_gpu", 2, "--data", data_root, "--ckpt", earlier_run, *COMMON],
                   budget=10)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "already holds a ddp resnet20 run at epoch 2/2" in lines[0]
    assert all(hint in lines[0] for hint in ("--resume", "--ckpt", "--overwrite"))
    assert digest(earlier_run / "last.pt") == before


# fsdp, and ddp (19 s): CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_diverging_run_stops_naming_the_step_and_never_saves(mode, earlier_run, data_root, tmp_path):
    # ddp writes over the earlier run on purpose (--overwrite): its good last.pt must survive
    # the NaN. fsdp starts in an empty folder: nothing at all may be written.
    folder = earlier_run if mode == "ddp" else tmp_path
    before = digest(folder / "last.pt") if mode == "ddp" else None
    proc = run_cli(["--mode", mode, "--num_gpu", 2, "--data", data_root, "--ckpt", folder, "--overwrite",
                    "--lr", "1e6", *COMMON], budget=15)
    lines = error_lines(proc)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "NaN/inf" in lines[0] and "epoch 1, step" in lines[0], proc.stderr
    assert "--lr" in lines[0] and "--resume" in lines[0]
    if mode == "ddp":
        assert digest(folder / "last.pt") == before
    else:
        assert not (folder / "last.pt").exists() and not list(folder.glob("shards-*"))


def test_the_guard_trips_on_the_first_non_finite_loss_without_a_scaler():
    guard = DivergenceGuard(torch.device("cpu"), patience=1)
    for step, loss in enumerate([1.0, 2.0, float("nan"), 1.0]):
        guard.observe(torch.tensor(loss), step)
    with pytest.raises(Diverged, match="epoch 3, step 2"):
        guard.check(epoch=2)


def test_with_a_grad_scaler_only_a_run_of_patience_non_finite_losses_trips():
    nan, inf = float("nan"), float("inf")
    skipped_steps = DivergenceGuard(torch.device("cpu"), patience=3)
    for step, loss in enumerate([nan, inf, 1.0, nan, nan, 0.5, inf]):
        skipped_steps.observe(torch.tensor(loss), step)
    skipped_steps.check(epoch=0)  # the scaler finding its scale: no stop
    diverged = DivergenceGuard(torch.device("cpu"), patience=3)
    for step, loss in enumerate([1.0, nan, nan, inf, nan]):
        diverged.observe(torch.tensor(loss), step)
    with pytest.raises(Diverged, match="3 steps in a row at epoch 1, step 3"):
        diverged.check(epoch=0)


def test_bf16_counts_as_emulated_without_the_cpu_flags_or_under_an_avx2_cap(tmp_path, monkeypatch):
    with_flags, without = tmp_path / "with", tmp_path / "without"
    with_flags.write_text("flags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    without.write_text("flags\t\t: fpu sse avx2 avx512f\n")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert cpu_precision.native_bf16(str(with_flags)) and not cpu_precision.native_bf16(str(without))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu_precision.native_bf16(str(with_flags))
    note = cpu_precision.bf16_note()
    assert "emulated" in note and "x the fp32 time" in note


@pytest.mark.slow  # 12 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_bf16_run_on_an_emulating_cpu_warns_once_and_records_it(data_root, tmp_path):
    tiny = ["--synthetic-train", 16, "--synthetic-test", 8, "--batch-size", 8, "--valid-size", 0]  # 2 steps
    proc = run_cli(["--mode", "dp", "--data", tmp_path / "data", "--ckpt", tmp_path, "--amp", "bf16",
                    "--epochs", 1, *SMALL, *tiny], env={"ONEDNN_MAX_CPU_ISA": "AVX2"}, budget=10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum("bf16 on this CPU is emulated" in line for line in proc.stderr.splitlines()) == 1
    assert any("emulated" in note for note in read_metrics(tmp_path / "metrics.json")["env"]["notes"])
