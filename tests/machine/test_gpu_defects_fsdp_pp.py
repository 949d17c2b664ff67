"""Regression tests for the later GPU-path defects that a CPU can show (fsdp and pp
with --channels-last: tests/training/test_toolbox.py; the GPU-only ones: tests/machine/test_gpu.py)."""
import random
import sys

import numpy as np
import pytest
import torch
import torch.distributed as tdist

from handler.modes import parse_config
from handler.runtime import devices
from handler.runtime.errors import UserError
from handler.train.checkpoint import make_checkpoint, rng_state, set_rng_state
from handler.train.optimizer import NO_FUSED_DTENSOR, build_sgd, settle, sgd_options
from handler.train.build import check_compatible
from tests.conftest import error_lines, run_cli
from tests.machine.test_devices import fake_smi, visible

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


# ---- 3: --amp fp16 synced the host and the device at every step ----------------------------
@pytest.fixture
def dtensor_params(tmp_path):
    """Parameters as FSDP2 holds them (DTensors), in a one-process gloo group."""
    from torch.distributed.tensor import DeviceMesh, DTensor, Replicate
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        yield [torch.nn.Parameter(DTensor.from_local(torch.ones(4), mesh, [Replicate()]))]
    finally:
        tdist.destroy_process_group()


def test_only_fp16_on_cuda_asks_for_the_fused_sgd_and_sharded_parameters_say_why_not(dtensor_params):
    plain = [torch.nn.Parameter(torch.ones(4))]
    assert sgd_options(CUDA, True, plain) == ({"fused": True}, "")
    for device, scaler in ((CUDA, False), (CPU, False), (CPU, True)):
        assert sgd_options(device, scaler, plain) == ({}, ""), (device, scaler)
    options, note = sgd_options(CUDA, True, dtensor_params)
    assert options == {} and note == NO_FUSED_DTENSOR and "sync" in note and "\n" not in note


class _Config:
    lr, momentum, weight_decay = 0.1, 0.9, 5e-4


def _train(optimizer_of, overflow_at, steps=4):
    """`steps` GradScaler steps of a small model (step `overflow_at` overflows); returns
    the weights and how often GradScaler.step read a value on the host."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    optimizer = optimizer_of(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    reads, real_item = [0], torch.Tensor.item

    def item(self):
        reads[0] += 1
        return real_item(self)
    torch.manual_seed(1)
    for i in range(steps):
        loss = model(torch.randn(16, 8)).square().mean() * (float("inf") if i == overflow_at else 1.0)
        scaler.scale(loss).backward()
        torch.Tensor.item = item
        try:
            scaler.step(optimizer)
        finally:
            torch.Tensor.item = real_item
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach() for p in model.parameters()], reads[0]


def _plain_sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)


def _trainers_sgd(params):
    """What fit() builds for --amp fp16 on CUDA (the fused SGD runs on CPU tensors too)."""
    optimizer, note = build_sgd(_Config, params, CUDA, scaler_enabled=True)
    assert optimizer.defaults["fused"] is True and not note
    settle(optimizer)
    return optimizer


@pytest.mark.parametrize("overflow_at", [0, 2])
def test_the_fp16_optimizer_reads_nothing_on_the_host_and_steps_like_plain_sgd(overflow_at):
    # Fused SGD skips an overflowed step in its kernel. Its own first step, skipped, left
    # uninitialised momentum buffers that the next step read: GradScaler's first steps
    # often overflow, so settle() gives them zeros first.
    plain, plain_reads = _train(_plain_sgd, overflow_at)
    fused, fused_reads = _train(_trainers_sgd, overflow_at)
    assert plain_reads == 4 and fused_reads == 0  # GradScaler's found_inf .item(), every step
    for a, b in zip(plain, fused):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_restored_unfused_optimizer_state_keeps_this_runs_fused_choice():
    # A checkpoint's param_groups carry the saving run's "fused"; a fused SGD loaded with
    # fused=False failed GradScaler's first step ("Expected grad_scale and found_inf to be None").
    model = torch.nn.Linear(4, 2)
    saved = _plain_sgd(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    saved.step()
    optimizer = _trainers_sgd(model.parameters())
    optimizer.load_state_dict(saved.state_dict())
    settle(optimizer)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.randn(3, 4)).sum()).backward()
    scaler.step(optimizer)
    assert all(group["fused"] for group in optimizer.param_groups)


# ---- 4: a resume where fewer GPUs are visible crashed in torch.cuda.set_rng_state --------
def test_a_resume_on_fewer_gpus_restores_the_visible_ones_and_says_the_rest_are_dropped(monkeypatch):
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    saved = rng_state()  # on a 2-GPU machine
    restored = {}

    def set_state(state, device="cuda"):
        index = torch.device(device).index if not isinstance(device, int) else device
        if (index or 0) >= torch.cuda.device_count():
            raise IndexError("list index out of range")  # what torch raises for a missing device
        restored[index or 0] = state.clone()
    for module in (torch.cuda, torch.cuda.random):  # set_rng_state_all calls the module's own name
        monkeypatch.setattr(module, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    random.seed(5), np.random.seed(5)
    note = set_rng_state(saved)
    assert list(restored) == [0] and torch.equal(restored[0], states[0])
    assert "2 GPUs but 1 are visible" in note and "the last 1 are dropped" in note
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    restored.clear()
    assert set_rng_state(saved) == "" and list(restored) == [0, 1]


# ---- 9: --resume --amp fp16 of a run saved without fp16 printed a raw RuntimeError ---------
def _saved(amp):
    scaler = torch.amp.GradScaler("cpu", enabled=amp == "fp16")
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return make_checkpoint(state={"model": {}}, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1),
                           scaler=scaler, epoch=1, step=0, best_acc=0.5, history=[],
                           config={"model": "resnet20", "amp": amp})


@pytest.mark.parametrize("saved_amp", ["off", "bf16"])
def test_resuming_into_fp16_from_a_run_without_it_is_one_line_naming_the_fix(saved_amp):
    cfg = parse_config(["--model", "resnet20", "--amp", "fp16", "--resume"], cuda_count=1)
    with pytest.raises(UserError) as err:
        check_compatible(_saved(saved_amp), cfg, 10, "ckpt/last.pt")
    message = str(err.value)
    assert "\n" not in message and f"saved with --amp {saved_amp}" in message
    assert f"resume with --amp {saved_amp}" in message and "without --resume" in message
    # An fp16 checkpoint resumes in fp16, and any checkpoint without fp16.
    check_compatible(_saved("fp16"), cfg, 10, "ckpt/last.pt")
    check_compatible(_saved(saved_amp), parse_config(["--model", "resnet20", "--resume"], cuda_count=1), 10, "x")


# ---- 10: a CUDA_VISIBLE_DEVICES naming no GPU was reported as a torch build to reinstall ----
@pytest.mark.parametrize("value, wrong", [("5", "5"), ("GPU-deadbeef", "GPU-deadbeef"), ("x,0", "x"),
                                          ("1", ""), ("GPU-1", ""), ("0,7", ""), ("", ""), ("-1", "")])
def test_the_visible_device_entry_that_hides_every_gpu(value, wrong):
    listing = "GPU 0: NVIDIA A100 (UUID: GPU-0)\nGPU 1: NVIDIA A100 (UUID: GPU-1)\n"
    assert devices.unknown_visible_device(value, listing) == wrong


@pytest.mark.slow  # 23 and 20 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
@pytest.mark.parametrize("value", ["5", "GPU-deadbeef"])
def test_a_visible_devices_naming_no_gpu_is_named_as_the_cause_in_one_line(value, tmp_path):
    env = {**visible(fake_smi(tmp_path / "bin", gpus=2)), "CUDA_VISIBLE_DEVICES": value}
    proc = run_cli(["-m", "handler.runtime.devices"], env=env, cmd=[sys.executable], timeout=60)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert f"CUDA_VISIBLE_DEVICES={value} hides every GPU" in lines[0] and "nvidia-smi -L lists" in lines[0]
    assert "install" not in lines[0]
