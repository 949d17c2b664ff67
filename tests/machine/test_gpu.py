"""End to end on GPUs: every mode through train_cifar.py at 1 GPU and at 2, fp16 with its
GradScaler, resume on the GPU, the CUDA-event phase timers, and the GPU-only regressions
(tests/machine/test_gpu_defects*.py hold the ones a CPU can show).

pp at 1 GPU runs one stage (schedule, micro-batches, evaluation, checkpoint gather); two stages
cannot share a GPU, since NCCL refuses two ranks on one device ("Duplicate GPU detected"), so
its NCCL send/recv between stages is proven by the 2-GPU tests.

All `gpu`-marked: skipped without CUDA; the 2-GPU ones also skip when fewer are visible.
They have not yet run on a GPU (none was available when they were written, 2026-11-23).
"""
import math
import os

import pytest
import torch

from handler.train.checkpoint import load_checkpoint
from tests.conftest import N_TEST, SMALL, read_metrics, run_cli

pytestmark = pytest.mark.gpu

ONE_EPOCH = ["--epochs", 1, "--batch-size", 64, "--valid-size", 100, *SMALL]
MODES = [("dp",), ("dp", "--dp-balanced"), ("ddp",), ("ddp_dali", "--dali-source", "memory"),
         ("ddp_dali", "--dali-source", "raw"), ("ddp_dali", "--dali-source", "jpeg"), ("fsdp",), ("pp",)]


def train(data_root, ckpt, mode_args, gpus, *extra):
    if mode_args[0] == "ddp_dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    proc = run_cli(["--mode", *mode_args, "--num_gpu", gpus, "--data", data_root, "--ckpt", ckpt,
                    *ONE_EPOCH, *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(ckpt / "metrics.json")


def assert_trained_on_gpus(m, mode, gpus, epochs=1):
    assert m["env"]["device"] == "cuda" and len(m["env"]["gpus"]) == gpus
    assert m["env"]["world_size"] == (1 if mode == "dp" else gpus)
    assert m["env"]["backend"] == ("none" if mode == "dp" else "nccl")
    assert [e["epoch"] for e in m["epochs"]] == list(range(epochs))
    assert all(math.isfinite(e["train_loss"]) for e in m["epochs"])
    assert m["test"]["samples"] == N_TEST and 0.0 <= m["test"]["acc"] <= 1.0


@pytest.mark.parametrize("mode_args", MODES, ids=" ".join)
def test_every_mode_trains_end_to_end_on_one_gpu(mode_args, data_root, tmp_path):
    m = train(data_root, tmp_path, mode_args, 1)
    assert_trained_on_gpus(m, mode_args[0], 1)
    if mode_args[0] == "ddp_dali":
        assert m["config"]["dali_source"] == mode_args[-1]


@pytest.mark.gpus(2)
@pytest.mark.parametrize("mode_args", [*MODES, ("ddp", "--sync-bn"),
                                       ("dp", "--amp", "bf16", "--activation-checkpointing")], ids=" ".join)
def test_every_mode_trains_end_to_end_on_two_gpus(mode_args, data_root, tmp_path):
    # dp bf16 + activation checkpointing: defects 3 and 4 (replicas on cuda:1 ran cuda:0's
    # weights; the worker threads ran fp16).
    m = train(data_root, tmp_path, mode_args, 2)
    assert_trained_on_gpus(m, mode_args[0], 2)
    if "--sync-bn" in mode_args:
        assert m["config"]["sync_bn"] is True
        assert any("once per BatchNorm layer per step" in n for n in m["env"]["notes"]), m["env"]["notes"]


def test_fp16_trains_with_a_live_grad_scaler_that_is_checkpointed(data_root, tmp_path):
    m = train(data_root, tmp_path, ("ddp",), 1, "--amp", "fp16")
    assert_trained_on_gpus(m, "ddp", 1)
    assert m["config"]["amp"] == "fp16"
    scaler = load_checkpoint(str(tmp_path / "last.pt"), "cpu")["scaler"]
    assert scaler, "GradScaler was disabled: its state_dict is empty"
    assert math.isfinite(scaler["scale"]) and scaler["scale"] > 0


@pytest.mark.parametrize("mode", ["dp", "ddp", "fsdp", "pp"])
def test_a_gpu_run_resumes_and_continues(mode, data_root, tmp_path):
    # Defect 1: loading onto cuda:N moved the RNG states to the GPU and set_rng_state raised.
    first = train(data_root, tmp_path, (mode,), 1, "--epochs", 2, "--stop-after", 1)
    assert [e["epoch"] for e in first["epochs"]] == [0]
    m = train(data_root, tmp_path, (mode,), 1, "--epochs", 2, "--resume")
    assert_trained_on_gpus(m, mode, 1, epochs=2)
    assert m["epochs"][0] == first["epochs"][0]  # the history came back with the checkpoint
    assert load_checkpoint(str(tmp_path / "last.pt"), "cpu")["epoch"] == 2


def test_cuda_event_phase_timers_add_up_to_the_epochs_wall_time(data_root, tmp_path):
    m = train(data_root, tmp_path, ("ddp",), 1, "--epochs", 2)
    for e in m["epochs"]:
        phases = sum(e["phase_s"].values())
        assert set(e["phase_s"]) == {"data", "forward", "backward", "optimizer"}
        assert abs(phases - e["time_s"]) <= 0.2 * e["time_s"], (e["epoch"], e["phase_s"], e["time_s"])


def test_a_training_step_never_synchronises_the_gpu():
    # A host value turned into a CUDA tensor every step blocked the CPU.
    # With fp16, GradScaler.step read found_inf on the host (.item()) unless
    # the optimiser is the fused SGD that fit() now builds, so the scaler here is live.
    from handler.train.config import Config
    from handler.train.loop import Step, _optimise
    from handler.train.optimizer import build_sgd, settle
    from handler.train.build import autocast_for
    from models import build_model
    device = torch.device("cuda:0")
    model = build_model("resnet20", 10).to(device)
    optimizer, note = build_sgd(Config(lr=0.01), model.parameters(), device, scaler_enabled=True)
    settle(optimizer)
    assert optimizer.defaults["fused"] is True and not note
    step = Step(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                scaler=torch.amp.GradScaler("cuda", enabled=True),
                autocast=autocast_for(Config(amp="fp16"), device), accum_steps=2)
    images, labels = torch.randn(32, 3, 32, 32, device=device), torch.randint(0, 10, (32,), device=device)
    _optimise(step, images, labels)  # warm-up: lazy initialisation may sync once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sums = _optimise(step, images, labels)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sums.device == device and math.isfinite(sums[0].item())
    assert step.scaler.is_enabled() and step.scaler.get_scale() > 0


@pytest.mark.parametrize("gpus", [1, pytest.param(2, marks=pytest.mark.gpus(2))])
@pytest.mark.parametrize("mode", ["dp", "ddp", "ddp_dali", "fsdp", "pp"])
def test_every_mode_trains_with_every_flag_validate_accepts_for_it_on_gpus(mode, gpus, data_root, tmp_path):
    # On GPUs: cuDNN's NHWC kernels and NCCL, with what only GPUs
    # accept: fp16 (pp: bf16) and --sync-bn. TORCH_DISTRIBUTED_DEBUG=DETAIL makes torch 2.14
    # compare pp's stage input strides as 2.6-2.11 always did.
    from tests.training.test_toolbox import TINY, accepted_flags
    if mode == "ddp_dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    flags = accepted_flags(mode, gpus)
    proc = run_cli(["--mode", mode, "--num_gpu", gpus, "--data", data_root / "flags", "--ckpt", tmp_path,
                    "--epochs", 1, *SMALL, *TINY, *flags],
                   env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if mode == "pp" else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(tmp_path / "metrics.json")
    assert m["env"]["device"] == "cuda" and m["config"]["channels_last"] and m["config"]["activation_checkpointing"]
    assert m["config"]["amp"] == ("bf16" if mode == "pp" else "fp16")
    assert m["config"]["sync_bn"] == (mode in ("ddp", "ddp_dali"))
    assert math.isfinite(m["epochs"][0]["train_loss"])
    if mode == "fsdp":  # fp16 on DTensors keeps its per-step sync, and says so
        assert any("DTensor" in note for note in m["env"]["notes"]), m["env"]["notes"]


@pytest.mark.gpus(2)
def test_pp_on_two_gpus_sends_over_nccl_evaluates_and_resumes_from_its_gathered_checkpoint(data_root, tmp_path):
    # Item 5: two stages on two GPUs, stopped after epoch 1 and resumed; the checkpoint rank 0
    # gathered holds the whole model, so ddp continues from it too.
    first = train(data_root, tmp_path / "pp", ("pp",), 2, "--epochs", 2, "--stop-after", 1)
    assert first["env"]["world_size"] == 2 and first["epochs"][0]["val_samples"] == 100
    whole = load_checkpoint(str(tmp_path / "pp" / "last.pt"), "cpu")
    from models import build_model
    assert whole["model"].keys() == build_model("resnet20", 10).state_dict().keys()
    m = train(data_root, tmp_path / "pp", ("pp",), 2, "--epochs", 2, "--resume")
    assert_trained_on_gpus(m, "pp", 2, epochs=2)
    ddp = train(data_root, tmp_path / "ddp", ("ddp",), 1, "--epochs", 2, "--resume", tmp_path / "pp" / "last.pt")
    assert [e["epoch"] for e in ddp["epochs"]] == [0, 1] and ddp["test"]["samples"] == N_TEST


@pytest.mark.gpus(2)
def test_dataparallel_replicas_on_every_gpu_run_bf16():
    # Defect 4, directly: each replica's thread keeps the run's bf16.
    from handler.DP.precision import AutocastInside
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            out = self.linear(x)
            seen.append((x.device.index, out.dtype))
            return out

    bf16 = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    model = torch.nn.DataParallel(AutocastInside(Probe().cuda(), bf16), device_ids=[0, 1])
    with bf16():
        out = model(torch.randn(8, 8, device="cuda:0"))
    assert out.dtype == torch.bfloat16
    assert sorted(seen) == [(0, torch.bfloat16), (1, torch.bfloat16)]


def test_a_channels_last_input_alone_selects_cudnns_nhwc_convolution():
    # Item 1: fsdp keeps its parameters contiguous (FSDP2 shards nothing else); its
    # --channels-last speed-up rests on cuDNN choosing NHWC from the input's layout.
    x = torch.randn(8, 16, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    weight = torch.randn(32, 16, 3, 3, device="cuda", requires_grad=True)
    out = torch.nn.functional.conv2d(x, weight, padding=1)
    assert weight.is_contiguous() and out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpus(2)
def test_a_two_gpu_checkpoint_resumes_where_one_gpu_is_visible(data_root, tmp_path):
    # Item 4: the checkpoint holds both GPUs' random states; restoring the second on a
    # machine showing one raised IndexError in torch.cuda.set_rng_state.
    first = train(data_root, tmp_path, ("ddp",), 2, "--epochs", 2, "--stop-after", 1)
    assert len(load_checkpoint(str(tmp_path / "last.pt"), "cpu")["rng"]["cuda"]) >= 2
    one = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    proc = run_cli(["--mode", "ddp", "--num_gpu", 1, "--data", data_root, "--ckpt", tmp_path, *ONE_EPOCH,
                    "--epochs", 2, "--resume"], env={"CUDA_VISIBLE_DEVICES": one})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "random states for" in proc.stderr and "are dropped" in proc.stderr
    m = read_metrics(tmp_path / "metrics.json")
    assert_trained_on_gpus(m, "ddp", 1, epochs=2)
    assert m["epochs"][0] == first["epochs"][0]
    assert any("are dropped" in note for note in m["env"]["notes"])
