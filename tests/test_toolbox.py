"""The optional techniques: each is off by default and, when on, leaves the maths intact."""
import math

import pytest
import torch

import train_cifar
from handler.train.config import Config
from handler.train.loop import Step, _optimise
from handler.train.model_options import checkpoint_stages
from handler.train.trainer import autocast_for
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


def test_toolbox_flags_train_together_on_cpu(data_root, tmp_path):
    # fp32 and resnet20: bf16 on a CPU without native bf16 is emulated and many times
    # slower (issue 11), and fastnet is 5x resnet20's work; each has its own small test
    # (the bf16 step below, fastnet's checkpointed gradients above). 256 images: 4 steps
    # of 64, in 2 micro-batches each, through every stage's checkpointed forward.
    tiny = ["--synthetic-train", 256, "--synthetic-test", 64, "--batch-size", 64, "--valid-size", 0]
    proc = run_cli(["--mode", "dp", "--data", data_root, "--ckpt", tmp_path, "--epochs", 1, *SMALL, *tiny,
                    "--channels-last", "--accum-steps", 2, "--activation-checkpointing", "--dp-balanced"],
                   budget=20)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(tmp_path / "metrics.json")
    assert m["config"]["accum_steps"] == 2 and m["config"]["channels_last"] and m["config"]["dp_balanced"]
    assert m["config"]["activation_checkpointing"] and m["config"]["amp"] == "off"
    assert m["test"]["samples"] == 64 and m["epochs"][0]["train_samples"] == 256
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
