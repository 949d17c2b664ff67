"""DDP is the same optimisation as one process: gradients, sharding and evaluation."""

import numpy as np
import pytest
import torch

from handler.train.config import Config
from handler.data.dataset import Splits
from handler.data.loaders import ShardSampler
from handler.DDP.cifar10_loader import get_DDP_loader
from handler.data.loaders import lab_loaders
from tests.conftest import free_port, spawn_within_budget
from tests.dist_workers import TinyNet, all_workers, fixed_batches, train_steps



def single_process_params(steps, batch, accum_steps=1):
    torch.manual_seed(0)
    model = TinyNet()
    train_steps(model, fixed_batches(steps, batch), accum_steps)
    return model.state_dict()


def assert_params_close(a, b, tol):
    for name in a:
        assert torch.allclose(a[name], b[name], atol=tol, rtol=0), f"{name} differs"


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    """Folder with what 2 gloo ranks saved: ddp.pt and fsdp.pt (TinyNet, 4 steps of 16),
    accum/ddp.pt (3 steps of 16 in 2 micro-batches) and bn.pt; one spawn for all of them."""
    out = tmp_path_factory.mktemp("gloo")
    spawn_within_budget(all_workers, (2, [free_port() for _ in range(4)], str(out)), 2,
                        budget=20, name="tests.dist_workers.all_workers")  # s, measured
    return out


def test_ddp_with_global_batch_B_matches_one_process_with_batch_B(gloo_runs):
    ddp = torch.load(gloo_runs / "ddp.pt", weights_only=True)
    assert_params_close(ddp, single_process_params(4, 16), tol=1e-5)


def test_two_rank_fsdp_matches_two_rank_ddp(gloo_runs):
    """FSDP reduce-scatters what DDP all-reduces; with 2 ranks each gradient element is
    the same two-term sum, so parameters agree to float rounding of the update (1e-6)."""
    ddp = torch.load(gloo_runs / "ddp.pt", weights_only=True)
    fsdp = torch.load(gloo_runs / "fsdp.pt", weights_only=True)
    assert ddp.keys() == fsdp.keys()
    assert_params_close(fsdp, ddp, tol=1e-6)


def test_batchnorm_statistics_stay_rank_local_in_training_and_agree_before_evaluation(gloo_runs):
    """No per-step buffer broadcast (it would cost a collective per step); the trainer's
    broadcast_buffers before each evaluation gives every rank rank 0's statistics."""
    stats = torch.load(gloo_runs / "bn.pt", weights_only=True)
    assert not torch.allclose(stats["before"][0], stats["before"][1])
    assert torch.equal(stats["after"][1], stats["after"][0])
    assert torch.equal(stats["after"][0], stats["before"][0])  # rank 0 keeps its own


def test_gradient_accumulation_equals_one_full_batch():
    steps, batch = 3, 16
    assert_params_close(single_process_params(steps, batch, accum_steps=4),
                        single_process_params(steps, batch), tol=1e-5)


def test_ddp_gradient_accumulation_matches_one_process(gloo_runs):
    ddp = torch.load(gloo_runs / "accum" / "ddp.pt", weights_only=True)
    assert_params_close(ddp, single_process_params(3, 16), tol=1e-5)


def splits_of(n_train, n_test):
    images = lambda n: np.zeros((n, 32, 32, 3), np.uint8)  # noqa: E731
    labels = lambda n: np.arange(n, dtype=np.int64)  # noqa: E731  (label = sample id)
    return Splits(train=(images(n_train), labels(n_train)), valid=(images(0), labels(0)),
                  test=(images(n_test), labels(n_test)), classes=[str(i) for i in range(10)])


@pytest.mark.parametrize("world", [2, 3])
def test_train_shards_cover_the_training_set_each_epoch_with_equal_batch_counts(world):
    n = 1000 + world - 1  # not divisible by the world size
    splits = splits_of(n, 10)
    for epoch in (0, 1):
        seen, counts = [], set()
        for rank in range(world):
            cfg = Config(mode="ddp", batch_size=8 * world, world_size=world, rank=rank, workers=0)
            loader = lab_loaders(get_DDP_loader, cfg, splits).train
            loader.set_epoch(epoch)
            seen.extend(loader.loader.sampler)
            counts.add(len(loader))
        assert set(seen) == set(range(n)), "every sample seen in the epoch"
        assert len(seen) - n == (-n) % world, "only the DistributedSampler padding repeats"
        assert len(counts) == 1, "every rank runs the same number of batches"


def test_train_order_changes_between_epochs():
    cfg = Config(mode="ddp", batch_size=16, world_size=2, rank=0, workers=0)
    loader = lab_loaders(get_DDP_loader, cfg, splits_of(200, 10)).train
    loader.set_epoch(0)
    first = list(loader.loader.sampler)
    loader.set_epoch(1)
    assert list(loader.loader.sampler) != first


@pytest.mark.parametrize("world", [1, 2, 3])
def test_evaluation_counts_every_test_image_exactly_once(world):
    n = 301  # not divisible by 2 or 3, nor by the batch
    labels = []
    for rank in range(world):
        cfg = Config(mode="ddp", batch_size=32 * world, world_size=world, rank=rank, workers=0)
        for _, y in lab_loaders(get_DDP_loader, cfg, splits_of(10, n)).test:
            labels.append(y)
    total = torch.cat(labels)
    assert len(total) == n
    assert torch.equal(torch.sort(total).values, torch.arange(n))


def test_shard_sampler_is_disjoint_and_complete():
    shards = [list(ShardSampler(10, r, 3)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(10))
