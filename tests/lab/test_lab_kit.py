"""The lab's functions driven the way the course kit's train_cifar.py drives them: an `args`
namespace, run_process(main_func, args), and in every process initialize_group, the mode's
get_*_loader(root=...), model_to_DDP, two plain epochs through the loaders' DataLoader
attributes (`sampler.set_epoch`, and DALI's `reset()`) and destroy_process in `finally`, then
a resume at epoch 1. Two CPU ranks over gloo; the data is written in the kit's two layouts."""
import argparse
import json
import os

import pytest
import torch
from torch import nn

from handler.data.augment import MEAN, STD
from handler.data.cifar_files import write_cifar
from handler.data.synthetic import CLASSES
from handler.DDP.model import model_to_DDP
from handler.DDP.utils import destroy_process, initialize_group, run_process
from scripts.kit_driver import identity_images  # one maker of images that name themselves
from tests.conftest import free_port

N_TRAIN, N_TEST, TRAIN_BATCH = 40, 10, 4


def write_layouts(root) -> dict:
    """The kit's scripts/init.sh folders: dataset/cifar10 (torchvision's) and
    dataset/cifar10_images/{train,valid,test}/<class name>/<n>.png (valid left empty, as the kit does)."""
    from PIL import Image
    train, test = identity_images(0, N_TRAIN), identity_images(N_TRAIN, N_TEST)
    write_cifar(str(root / "cifar10"), *train, *test, CLASSES)
    for split, (images, labels), first in (("train", train, 0), ("test", test, N_TRAIN)):
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = root / "cifar10_images" / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{first + i}.png")
    (root / "cifar10_images" / "valid").mkdir()
    return {"ddp": str(root / "cifar10"), "ddp_dali": str(root / "cifar10_images")}


def decoded_ids(images: torch.Tensor) -> list:
    """The index each normalised image encodes, read from its centre pixel."""
    centre = images[:, :, 16, 16].float().cpu() * torch.tensor(STD) * 255 + torch.tensor(MEAN) * 255
    rgb = centre.round().long()
    return (rgb[:, 0] + 256 * rgb[:, 1]).tolist()


def tiny_model() -> nn.Module:
    torch.manual_seed(0)  # the same weights in every rank, and in the test's single process
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))


def main_func(proc_id, args):
    """The kit's main_func, written the lab's way, with a loop written for the DataLoader the
    kit's get_DP_loader returns: `train_loader.sampler.set_epoch(epoch)` before each epoch (and,
    for DALI, the lab's `reset()` after it). Epochs args.start_epoch..args.epochs-1."""
    initialize_group(proc_id, args.ip, args.port, args.num_gpu)
    try:
        if args.mode == "ddp_dali":
            from handler.DALI.cifar10_loader import get_DALI_loader as get_loader
        else:
            from handler.DDP.cifar10_loader import get_DDP_loader as get_loader
        test_loader, train_loader, valid_loader = get_loader(root=args.data, test_batch=5, train_batch=TRAIN_BATCH,
                                                             cutout=0, num_workers=1, download=False)
        model = model_to_DDP(tiny_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        epochs, first = [], {}
        for epoch in range(args.start_epoch, args.epochs):
            train_loader.sampler.set_epoch(epoch)
            seen, sums, steps = [], [], 0
            for images, labels in train_loader:
                ids = decoded_ids(images)
                assert [i % 10 for i in ids] == labels.tolist(), "labels do not follow the images"
                seen, sums = seen + ids, sums + images.sum(dim=(1, 2, 3)).tolist()
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(images), labels).backward()
                if not first:
                    first = {"images": images.tolist(), "labels": labels.tolist(),
                             "grads": [p.grad.tolist() for p in model.parameters()]}
                optimizer.step()
                steps += 1
            if args.mode == "ddp_dali":
                train_loader.reset()
            epochs.append({"seen": seen, "sums": sums, "steps": steps})
        tested = [i for images, _ in test_loader for i in decoded_ids(images)]
        record = {"epochs": epochs, "len": len(train_loader), "tested": tested, "valid": valid_loader is None,
                  "first": first, "dataset": len(train_loader.dataset), "batch_size": train_loader.batch_size,
                  "sampler": len(train_loader.sampler)}
        with open(os.path.join(args.ckpt, f"rank{proc_id}.json"), "w") as f:
            json.dump(record, f)
    finally:
        destroy_process()


def run_kit(tmp_path, mode, data, *, start_epoch=0, epochs=2) -> list:
    """The kit's flow on 2 CPU ranks; each rank's record."""
    args = argparse.Namespace(num_gpu=2, ip="127.0.0.1", port=free_port(), data=data, ckpt=str(tmp_path),
                              mode=mode, lr=0.1, start_epoch=start_epoch, epochs=epochs)
    run_process(main_func, args)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


# ddp_dali (DALI pipelines in both ranks, twice): CI's slow step (pytest.ini); ddp stays in the main suite.
# Both: CI's slow step (pytest.ini); the kit's run scripts stay in the main suite (tests/lab/test_lab_run_scripts.py).
@pytest.mark.parametrize("mode", [pytest.param("ddp", marks=pytest.mark.slow), pytest.param("ddp_dali", marks=pytest.mark.slow)])
def test_the_kits_train_cifar_flow_covers_every_image_once_and_averages_gradients(tmp_path, mode):
    if mode == "ddp_dali":
        pytest.importorskip("nvidia.dali")
    data = write_layouts(tmp_path)[mode]
    ranks = run_kit(tmp_path, mode, data)

    for epoch in range(2):
        seen = ranks[0]["epochs"][epoch]["seen"] + ranks[1]["epochs"][epoch]["seen"]
        assert sorted(seen) == list(range(N_TRAIN)), f"epoch {epoch}: not every image exactly once"
    for rank in ranks:
        assert rank["epochs"][1]["seen"] != rank["epochs"][0]["seen"], "epoch 1 replayed epoch 0's order"
        assert rank["len"] == rank["epochs"][0]["steps"] == rank["epochs"][1]["steps"] == N_TRAIN // 2 // TRAIN_BATCH
        assert (rank["dataset"], rank["batch_size"], rank["sampler"]) == (N_TRAIN, TRAIN_BATCH, N_TRAIN // 2)
        assert rank["valid"], "valid_size=0 gives no validation loader"
    tested = ranks[0]["tested"] + ranks[1]["tested"]
    assert sorted(tested) == list(range(N_TRAIN, N_TRAIN + N_TEST))
    # DDP's averaged gradient equals one process's on the same global batch.
    model = tiny_model()
    images = torch.tensor(ranks[0]["first"]["images"] + ranks[1]["first"]["images"])
    labels = torch.tensor(ranks[0]["first"]["labels"] + ranks[1]["first"]["labels"])
    nn.functional.cross_entropy(model(images), labels).backward()
    for param, ddp_grad in zip(model.parameters(), ranks[0]["first"]["grads"]):
        torch.testing.assert_close(torch.tensor(ddp_grad), param.grad, atol=1e-5, rtol=1e-4)

    # A run resumed at epoch 1 (sampler.set_epoch(1) on fresh loaders) replays its order; DALI
    # replays its crops and flips too (its draws are seeded by epoch; the DataLoader's come
    # from torch's global generator, which a resume would restore from its checkpoint).
    resumed = run_kit(tmp_path, mode, data, start_epoch=1)
    for rank, again in zip(ranks, resumed):
        assert again["epochs"][0]["seen"] == rank["epochs"][1]["seen"], "the resumed epoch's order differs"
        if mode == "ddp_dali":
            assert again["epochs"][0]["sums"] == rank["epochs"][1]["sums"], "the resumed epoch's pixels differ"


def test_the_ddp_loader_goes_on_to_the_next_epoch_without_set_epoch_and_set_epoch_replays_one(tmp_path):
    """A loop written the kit's way may never call set_epoch: a DistributedSampler alone then
    replays one order every epoch, while the DALI loader goes on. get_DDP_loader's train loader
    goes on as DALI's does; set_epoch(e) still starts exactly epoch e (a resume replays it)."""
    from handler.DDP.cifar10_loader import get_DDP_loader
    root = write_layouts(tmp_path)["ddp"]

    def train_loader():
        return get_DDP_loader(10, TRAIN_BATCH, root=root, cutout=0, download=False, rank=0, world_size=1)[1]

    def one_pass(loader):
        return [i for images, _ in loader for i in decoded_ids(images)]

    train = train_loader()
    epochs = [one_pass(train) for _ in range(3)]
    assert all(sorted(e) == list(range(N_TRAIN)) for e in epochs), "every image once per pass"
    assert len({tuple(e) for e in epochs}) == 3, "a pass without set_epoch replayed an earlier epoch"
    resumed = train_loader()
    resumed.set_epoch(1)
    assert one_pass(resumed) == epochs[1], "set_epoch(1) must replay epoch 1 exactly"
    train.set_epoch(2)
    assert one_pass(train) == epochs[2], "set_epoch(2) on a used loader must replay epoch 2"
