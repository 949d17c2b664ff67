"""The optional techniques: each is off by default and, when on, leaves the maths intact."""
import math

import pytest
import torch

from handler.common.model_options import checkpoint_stages
from handler.DP.balanced import LossInside, replica_cross_entropy
from models import build_model
from tests.conftest import N_TEST, SMALL, error_lines, read_metrics, run_cli
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
    proc = run_cli(["--mode", "dp", "--data", data_root, "--ckpt", tmp_path, "--epochs", 1,
                    "--batch-size", 64, "--valid-size", 0, *SMALL, "--model", "fastnet",
                    "--amp", "bf16", "--channels-last", "--accum-steps", 2,
                    "--activation-checkpointing", "--dp-balanced"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(tmp_path / "metrics.json")
    assert m["config"]["amp"] == "bf16" and m["config"]["accum_steps"] == 2
    assert m["test"]["samples"] == N_TEST and math.isfinite(m["epochs"][0]["train_loss"])


def test_sync_bn_without_gpu_is_a_clear_error():
    proc = run_cli(["--mode", "ddp", "--sync-bn", *SMALL])
    assert proc.returncode != 0 and "--sync-bn needs GPUs" in error_lines(proc)[0]


@pytest.mark.gpu
def test_sync_bn_converts_batchnorm_under_ddp(data_root, tmp_path):
    proc = run_cli(["--mode", "ddp", "--num_gpu", 1, "--sync-bn", "--data", data_root, "--ckpt", tmp_path,
                    "--epochs", 1, "--batch-size", 64, "--valid-size", 0, *SMALL])
    assert proc.returncode == 0, proc.stderr[-3000:]
