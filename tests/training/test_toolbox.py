"""The optional techniques: each is off by default and, when on, leaves the maths intact."""
import math

import pytest
import torch

import train_cifar
from handler.modes import parse_config
from handler.runtime.errors import UserError
from handler.train.config import Config
from handler.train.loop import Step, _optimise
from handler.train.model_options import checkpoint_stages
from handler.train.build import autocast_for
from handler.DP.balanced import LossInside, replica_cross_entropy
from models import build_model
from tests.conftest import SMALL, read_metrics, run_cli
from tests.dist_workers import TinyNet, fixed_batches, train_steps


def grads_of(model, images, labels):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["resnet20", "fastnet"])
def test_activation_checkpointing_gives_the_same_gradients(name):
    torch.manual_seed(0)
    plain = build_model(name, 10)
    checkpointed = build_model(name, 10)
    checkpointed.load_state_dict(plain.state_dict())
    checkpoint_stages(checkpointed)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    a, b = grads_of(plain, images, labels), grads_of(checkpointed, images, labels)
    assert a.keys() == b.keys()
    for name_ in a:
        assert torch.allclose(a[name_], b[name_], atol=1e-6, rtol=1e-5), name_
    assert list(plain.state_dict()) == list(checkpointed.state_dict()), "checkpoint keys unchanged"


def test_balanced_dp_loss_inside_the_replica_trains_like_the_plain_loss():
    batches = fixed_batches(3, 16)
    torch.manual_seed(0)
    plain = TinyNet()
    train_steps(plain, batches)
    torch.manual_seed(0)
    inner = TinyNet()
    train_steps(LossInside(inner), batches, criterion=replica_cross_entropy)
    for name, value in plain.state_dict().items():
        assert torch.allclose(value, inner.state_dict()[name], atol=1e-6), name


@pytest.mark.gpu
def test_balanced_dp_on_gpus_matches_plain_dp():
    device_ids = list(range(torch.cuda.device_count()))
    batches = [(x.cuda(), y.cuda()) for x, y in fixed_batches(3, 16)]
    torch.manual_seed(0)
    plain = TinyNet().cuda()
    train_steps(torch.nn.DataParallel(plain, device_ids=device_ids), batches)
    torch.manual_seed(0)
    inner = TinyNet().cuda()
    train_steps(torch.nn.DataParallel(LossInside(inner), device_ids=device_ids), batches,
                criterion=replica_cross_entropy)
    for name, value in plain.state_dict().items():
        assert torch.allclose(value, inner.state_dict()[name], atol=1e-5), name


# The techniques a run can switch on, as validate() sees them: each mode runs every one of
# them that validate() accepts for it, all together (tests/machine/test_gpu.py does the same on GPUs,
# where fp16 and --sync-bn are accepted too).
TOOLBOX = (("--channels-last",), ("--accum-steps", "2"), ("--activation-checkpointing",), ("--amp", "bf16"),
           ("--amp", "fp16"), ("--dp-balanced",), ("--sync-bn",))
ALL_MODES = ("dp", "ddp", "ddp_dali", "fsdp", "pp")
# One step of 16 images, in 2 micro-batches per process (pp: 4): bf16 is emulated on most
# CPUs (45x the fp32 time of a convolution here), so the work stays this small.
TINY = ["--synthetic-train", 16, "--synthetic-test", 8, "--batch-size", 16, "--valid-size", 0]


def accepted_flags(mode: str, gpus: int) -> list:
    """The TOOLBOX entries validate() accepts for `mode` on `gpus` GPUs (0: the CPU), one
    amp at most: fp16 where it is accepted, else bf16."""
    processes = gpus or (1 if mode == "dp" else 2)
    base = ["--mode", mode, "--num_gpu", str(processes), *map(str, TINY)]
    flags = []
    for flag in TOOLBOX:
        try:
            parse_config([*base, *flag], cuda_count=gpus)
        except UserError:
            continue
        flags.append(flag)
    amps = [f for f in flags if f[0] == "--amp"]
    flags = [f for f in flags if f[0] != "--amp"] + amps[-1:]
    parse_config([*base, *(a for f in flags for a in f)], cuda_count=gpus)  # and all of them together
    return [a for f in flags for a in f]


def test_the_flag_table_follows_validate(monkeypatch):
    # --amp bf16's rule asks the GPUs' compute capability: torch.cuda, the CUDA boundary,
    # answers as an H100's for the rows with GPUs.
    import torch
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert accepted_flags("dp", 0) == ["--channels-last", "--accum-steps", "2", "--activation-checkpointing",
                                       "--dp-balanced", "--amp", "bf16"]
    assert accepted_flags("pp", 0) == ["--channels-last", "--activation-checkpointing", "--amp", "bf16"]
    assert accepted_flags("ddp", 1) == ["--channels-last", "--accum-steps", "2", "--activation-checkpointing",
                                        "--sync-bn", "--amp", "fp16"]
    assert accepted_flags("fsdp", 1)[-2:] == ["--amp", "fp16"] and "--sync-bn" not in accepted_flags("fsdp", 1)
    assert accepted_flags("pp", 2) == ["--channels-last", "--activation-checkpointing", "--amp", "bf16"]
    assert accepted_flags("dp", 2)[-3:] == ["--dp-balanced", "--amp", "fp16"]


# fsdp (20 s): CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box (fsdp
# trains in the main suite in test_ddp_correctness.py); the others are the main suite's training run of their mode
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m == "fsdp" else m for m in ALL_MODES])
def test_every_mode_trains_with_every_flag_validate_accepts_for_it(mode, data_root, tmp_path):
    # fsdp --channels-last once crashed in fully_shard (non-contiguous parameters), and pp
    # --channels-last failed its first step on torch 2.6-2.11 (stage 0's example input had
    # NCHW strides): TORCH_DISTRIBUTED_DEBUG=DETAIL makes torch 2.14 compare them too. Only
    # for pp: torch 2.14.1's DDP crashes at construction under DETAIL (SIGSEGV, any model).
    flags = accepted_flags(mode, 0)
    procs = 1 if mode == "dp" else 2
    if mode == "ddp_dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    proc = run_cli(["--mode", mode, "--num_gpu", procs, "--data", tmp_path / "data", "--ckpt", tmp_path,
                    "--epochs", 1, *SMALL, *TINY, *flags], budget=30,
                   env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if mode == "pp" else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(tmp_path / "metrics.json")
    config = m["config"]
    assert config["channels_last"] and config["activation_checkpointing"] and config["amp"] == "bf16"
    assert config["accum_steps"] == (1 if mode == "pp" else 2) and config["dp_balanced"] == (mode == "dp")
    assert m["env"]["world_size"] == procs
    assert m["test"]["samples"] == 8 and m["epochs"][0]["train_samples"] == 16
    assert math.isfinite(m["epochs"][0]["train_loss"])


def test_one_bf16_step_computes_in_bf16_and_keeps_fp32_master_weights():
    torch.manual_seed(0)
    model = build_model("resnet20", 10)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    dtypes = []
    for module in (model.stem, model.head):
        module.register_forward_hook(lambda mod, inputs, out: dtypes.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = Step(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                scaler=torch.amp.GradScaler("cpu", enabled=False),
                autocast=autocast_for(Config(amp="bf16"), torch.device("cpu")))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    loss_sum, _ = _optimise(step, images, labels)
    assert dtypes == [torch.bfloat16, torch.bfloat16], "convolutions and the head ran in bf16"
    assert math.isfinite(loss_sum.item() / 8)
    assert all(p.dtype == torch.float32 for p in model.parameters()), "master weights stay fp32"
    assert all(not torch.equal(before[name], p) for name, p in model.named_parameters()), \
        "the step updated every fp32 weight"


def test_sync_bn_without_gpu_is_a_clear_error(capsys):
    # In this process (no process start-up): the conftest hides GPUs from it on a GPU host.
    with pytest.raises(SystemExit) as exit_info:
        train_cifar.main(["--mode", "ddp", "--sync-bn", *SMALL])
    assert exit_info.value.code not in (0, None)
    assert "--sync-bn needs GPUs" in capsys.readouterr().err


@pytest.mark.gpu
def test_sync_bn_converts_batchnorm_under_ddp(data_root, tmp_path):
    proc = run_cli(["--mode", "ddp", "--num_gpu", 1, "--sync-bn", "--data", data_root, "--ckpt", tmp_path,
                    "--epochs", 1, "--batch-size", 64, "--valid-size", 0, *SMALL])
    assert proc.returncode == 0, proc.stderr[-3000:]
