"""The DALI data path (--mode ddp_dali) on CPU: sharding, exact evaluation,
augmentation semantics, label alignment and the derived-file cache.

Ranks are simulated in one process: one pipeline per rank, no process group.
Images carry their identity in their pixels so every sample can be traced.
"""
import os

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)")

from handler.data.augment import MEAN, PAD, STD, crop_flip, eval_transform  # noqa: E402
from handler.train.config import Config  # noqa: E402
from handler.data.loaders import lab_loaders  # noqa: E402
from handler.data.dataset import Splits  # noqa: E402
from handler.runtime.devices import cuda_status  # noqa: E402
from handler.runtime.errors import UserError  # noqa: E402
from handler.data.synthetic import make_images  # noqa: E402
from handler.DALI import derived  # noqa: E402
from handler.DALI.cifar10_loader import get_DALI_loader, require_dali, resolve_source  # noqa: E402
from handler.DALI.options import DaliOptions  # noqa: E402

SCALE = torch.tensor(STD).view(3, 1, 1) * 255
OFFSET = torch.tensor(MEAN).view(3, 1, 1) * 255
GREY = 128


def config(tmp_path, world=1, rank=0, local_batch=8, cutout=0, use_cuda=False):
    return Config(mode="ddp_dali", seed=0, workers=1, batch_size=local_batch * world, world_size=world,
                  rank=rank, data=str(tmp_path), cutout=cutout, valid_size=0, use_cuda=use_cuda,
                  device="cuda:0" if use_cuda else "cpu")


def dali_loader(cfg, data, source):
    """The loaders for one --dali-source: the source is the config's option, its one way in."""
    return lab_loaders(get_DALI_loader, cfg.with_section(DaliOptions(dali_source=source)), data, pass_cfg=True)


def identity_images(n):
    """Flat images: R,G encode the index, B the label (index % 10, times 20)."""
    ids = np.arange(n)
    labels = ids % 10
    colours = np.stack([ids % 256, ids // 256, labels * 20], axis=1).astype(np.uint8)
    return np.broadcast_to(colours[:, None, None, :], (n, 32, 32, 3)).copy(), labels.astype(np.int64)


def splits(train, test=None):
    empty = (train[0][:0], train[1][:0])
    return Splits(train=train, valid=empty, test=test if test is not None else train, classes=[])


def pixels(images):
    """Normalised NCHW float back to 0-255 pixel values (NCHW, float)."""
    return images.float().cpu() * SCALE + OFFSET


def centre_codes(images):
    """(index, label) encoded at each image's centre, which no crop or flip moves away."""
    centre = pixels(images)[:, :, 16, 16].round().long()
    return (centre[:, 0] + 256 * centre[:, 1]).tolist(), (centre[:, 2].float() / 20).round().long().tolist()


def run_pass(loader, epoch=0):
    """(indices, labels from pixels, labels yielded, batch count) of one pass."""
    loader.set_epoch(epoch)
    ids, pixel_labels, labels, batches = [], [], [], 0
    for images, y in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        assert y.dtype == torch.int64 and y.shape == (len(images),)
        i, p = centre_codes(images)
        ids, pixel_labels, labels, batches = ids + i, pixel_labels + p, labels + y.tolist(), batches + 1
    return ids, pixel_labels, labels, batches


def passes(loaders, epochs=2):
    """Per epoch: the indices every rank saw, and each rank's batch count (checked against len)."""
    for epoch in range(epochs):
        seen, counts = [], []
        for loader in loaders:
            ids, _, _, batches = run_pass(loader, epoch)
            assert batches == len(loader)
            seen, counts = seen + ids, counts + [batches]
        yield seen, counts


@pytest.mark.parametrize("source", ["memory", "raw"])
@pytest.mark.parametrize("world, n", [(2, 101), (3, 100)])  # neither divides by world * 8
def test_training_shards_cover_the_split_with_equal_batch_counts(tmp_path, world, n, source):
    data = splits(identity_images(n))
    loaders = [dali_loader(config(tmp_path, world, rank), data, source).train for rank in range(world)]
    for seen, counts in passes(loaders):
        assert len(set(counts)) == 1, f"ranks ran {counts} batches: DDP would hang"
        assert set(seen) == set(range(n))
        assert len(seen) == -(-n // world) * world  # padded by fewer than `world` repeats


# Unpadded, DALI's shards would hold 48/49 and 16/16/17 images: 6 vs 7 and 2 vs 3 batches of 8.
# Padded, each rank holds 8k+1 images and drops the one-image batch, as the DDP loader does.
@pytest.mark.parametrize("source", ["memory", "raw"])
@pytest.mark.parametrize("world, n", [(2, 97), (3, 49)])
def test_shards_that_differ_by_one_still_give_equal_full_batches(tmp_path, world, n, source):
    data = splits(identity_images(n))
    loaders = [dali_loader(config(tmp_path, world, rank), data, source).train for rank in range(world)]
    for seen, counts in passes(loaders):
        assert len(set(counts)) == 1, f"ranks ran {counts} batches: DDP would hang"
        assert len(seen) == counts[0] * 8 * world and len(set(seen)) >= n - world


@pytest.mark.parametrize("source", ["memory", "raw"])
def test_an_epoch_rebuilt_after_a_restart_replays_the_same_batches(tmp_path, source):
    data = splits(identity_images(60))
    original, restarted = (dali_loader(config(tmp_path, cutout=8), data, source).train for _ in range(2))
    for epoch in range(2):
        run_pass(original, epoch)
    original.set_epoch(2)
    restarted.set_epoch(2)
    for (a, y), (b, z) in zip(original, restarted, strict=True):
        assert torch.equal(a, b) and torch.equal(y, z)
    assert run_pass(original, 2) == run_pass(restarted, 2) != run_pass(restarted, 1)


@pytest.mark.parametrize("source", ["memory", "raw"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_evaluation_yields_every_test_image_exactly_once(tmp_path, world, source):
    n = 50  # not divisible by world * local batch (8, 16, 24)
    data = splits(identity_images(60), test=identity_images(n))
    seen = []
    for rank in range(world):
        loader = dali_loader(config(tmp_path, world, rank), data, source).test
        for epoch in range(2):
            ids, _, _, batches = run_pass(loader, epoch)
            assert batches == len(loader)
        seen += ids
    assert sorted(seen) == list(range(n))


class CountImages(torch.nn.Module):
    """Logits that name each image's label (read from its pixels): evaluate's counts are exact."""

    def forward(self, images):
        labels = centre_codes(images)[1]
        return torch.nn.functional.one_hot(torch.tensor(labels), 10).float()


# Rank 0's shard of 101 is 50 images, one short of rank 1's 51 and a multiple of the batch
# of 10: DALI pads it with an all-padding sixth batch that evaluate never asks for. Unless
# the loader finishes that pass, the next pass's reset is refused and rank 0 counts nothing.
@pytest.mark.parametrize("source", ["raw", "jpeg", "memory"])
def test_every_rank_validates_every_image_on_every_epoch(tmp_path, source):
    from handler.train.loop import evaluate
    data = Splits(train=identity_images(40), valid=identity_images(101), test=identity_images(20), classes=[])
    loaders = [dali_loader(config(tmp_path, 2, rank, local_batch=10), data, source).valid
               for rank in range(2)]
    assert [len(loader) for loader in loaders] == [5, 6]
    for epoch in range(3):
        counted = [evaluate(CountImages(), loader, "validate", torch.device("cpu"))
                   for loader in loaders]  # no process group: each result is that rank's own
        assert [c["samples"] for c in counted] == [50, 51], f"epoch {epoch + 1}"
        assert all(c["acc"] == 1.0 for c in counted)


@pytest.mark.parametrize("source", ["memory", "raw", "jpeg"])
def test_labels_stay_aligned_with_images(tmp_path, source):
    loaders = dali_loader(config(tmp_path), splits(identity_images(120)), source)
    for loader in (loaders.train, loaders.test):
        ids, pixel_labels, labels, _ = run_pass(loader)
        assert labels == pixel_labels
        if source != "jpeg":  # lossless, so the index survives too
            assert labels == [i % 10 for i in ids]


def probe_images(n):
    """Grey images with a bright pixel at (16, 16) and a dimmer marker to its right."""
    images = np.full((n, 32, 32, 3), GREY, np.uint8)
    images[:, 16, 16] = 255
    images[:, 16, 17] = 200
    return images, np.zeros(n, np.int64)


@pytest.mark.parametrize("source", ["memory", "raw"])
def test_crop_shifts_span_minus4_to_4_and_half_the_images_flip(tmp_path, source):
    n = 512
    loader = dali_loader(config(tmp_path, local_batch=64), splits(probe_images(n)), source).train
    shifts, flips = [], 0
    for images, _ in loader:
        for image in pixels(images).round():
            (y,), (x,) = torch.nonzero(image[0] == 255, as_tuple=True)
            flipped = image[0, y, x - 1] == 200
            x = 31 - x if flipped else x
            dy, dx = 16 - y.item(), 16 - x.item()
            shifts.append((dy, dx))
            flips += int(flipped)
            # The padding is black pixels, as RandomCrop's zero fill before ToTensor.
            black_rows = int((image[0] == 0).all(dim=1).sum())
            assert black_rows == abs(dy)
    shifts = np.array(shifts)
    assert len(shifts) == n
    for axis in (0, 1):
        assert shifts[:, axis].min() == -4 and shifts[:, axis].max() == 4
        assert abs(shifts[:, axis].mean()) < 0.5  # standard error ~0.11
    assert abs(flips - n / 2) < 60  # binomial sd ~11


def noise_images(n):
    """Random pixels (no two crops of one image alike), each labelled with its own index."""
    return np.random.default_rng(7).integers(1, 256, (n, 32, 32, 3), dtype=np.uint8), np.arange(n)


def reference(image, top, left, flip):
    """handler/data/augment.py's crop and flip, normalised as the evaluation transform does."""
    return eval_transform()(crop_flip(image, top, left, flip))


def test_memory_source_crops_and_flips_as_the_reference_does_for_the_same_draws(tmp_path):
    """Exact: BatchFeed draws each image's window and flip; DALI's crop_mirror_normalize must
    cut the window crop_flip cuts for those draws."""
    from types import SimpleNamespace
    from handler.DALI.pipeline import BatchFeed, CifarPipeline, DALIWrapper
    images, labels = noise_images(48)
    cfg, order = config(tmp_path, local_batch=16), np.random.default_rng(1).permutation(48)
    pipes = []
    loader = DALIWrapper(lambda epoch: pipes.append(CifarPipeline(None, 16, True, 0, None, 0, 1, 1, seed=5,
                                                                  memory=(images, labels, order))) or pipes[-1],
                         samples=48, batch=16)
    feed = BatchFeed(images, labels, order, 16, train=True, seed=pipes[0].seed)
    for i, (out, y) in enumerate(loader):
        _, fed, pos_x, pos_y, mirror = feed(SimpleNamespace(iteration=i))
        assert y.tolist() == fed.tolist()
        tops, lefts = (pos * 2 * PAD for pos in (pos_y, pos_x))
        assert np.array_equal(tops, np.rint(tops)) and np.array_equal(lefts, np.rint(lefts)), "not whole pixels"
        tops, lefts = tops.astype(int), lefts.astype(int)
        expected = torch.stack([reference(images[k], t, l, bool(f)) for k, t, l, f in zip(fed, tops, lefts, mirror)])
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    assert i == 2
    # The draws themselves: RandomCrop's and RandomHorizontalFlip's distribution (uniform offsets,
    # p = 0.5), as the file source's test below checks for DALI's own draws.
    many = BatchFeed(np.zeros((512, 32, 32, 3), np.uint8), np.zeros(512), np.arange(512), 512, train=True, seed=3)
    _, _, pos_x, pos_y, mirror = many(SimpleNamespace(iteration=0))
    assert_uniform([*(np.rint(pos * 2 * PAD).astype(int) for pos in (pos_y, pos_x)), mirror])


def assert_uniform(draws) -> None:
    """[tops, lefts, flips] of n images: every offset 0..2*PAD about n/9 times, about n/2 flips."""
    n = len(draws[0])
    for drawn in draws[:2]:  # expected n/9 each, sd 5.0 at n = 256: within 4 sd
        assert drawn.min() >= 0 and drawn.max() <= 2 * PAD
        counts = np.bincount(drawn, minlength=2 * PAD + 1)
        assert np.all(np.abs(counts - n / 9) <= 4 * np.sqrt(n * 8 / 81)), counts
    assert abs(draws[2].sum() - n / 2) <= 5 * np.sqrt(n / 4)


@pytest.mark.slow  # 22 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_file_source_crops_and_flips_are_the_references_drawn_uniformly(tmp_path):
    """Same distribution: DALI draws inside its graph, so each output must be exactly the
    reference for one (top, left, flip), and those must spread uniformly."""
    n = 256
    images, labels = noise_images(n)
    loader = dali_loader(config(tmp_path, local_batch=64), splits((images, labels)), "raw").train
    draws = []
    for out, y in loader:
        for image, k in zip(pixels(out).round().to(torch.uint8).permute(0, 2, 3, 1).numpy(), y.tolist()):
            matches = [(t, l, f) for t in range(2 * PAD + 1) for l in range(2 * PAD + 1) for f in (False, True)
                       if np.array_equal(image, crop_flip(images[k], t, l, f))]
            assert len(matches) == 1, f"image {k}: {len(matches)} reference crops match"
            draws += matches
    assert len(draws) == n
    assert_uniform([np.array(column, dtype=int) for column in zip(*draws)])


@pytest.mark.parametrize("source", ["memory", "raw"])
def test_cutout_zeroes_one_square_centred_on_a_uniform_pixel(tmp_path, source):
    size, n = 8, 256
    images = np.full((n, 32, 32, 3), GREY, np.uint8)  # normalised grey is nonzero in every channel
    loader = dali_loader(config(tmp_path, local_batch=64, cutout=size),
                         splits((images, np.zeros(n, np.int64))), source).train
    full, clipped = 0, {"top": 0, "bottom": 0, "left": 0, "right": 0}
    for batch, _ in loader:
        for image in batch:
            ys, xs = torch.nonzero((image == 0).all(dim=0), as_tuple=True)
            top, bottom, left, right = ys.min().item(), ys.max().item(), xs.min().item(), xs.max().item()
            h, w = bottom - top + 1, right - left + 1
            assert len(ys) == h * w, "the zeroed region is not a rectangle"
            # Centred on a pixel inside the image: at least half the square survives clipping.
            assert size // 2 <= h <= size and size // 2 <= w <= size
            assert h == size or top == 0 or bottom == 31
            assert w == size or left == 0 or right == 31
            full += int(h == size and w == size)
            clipped["top"] += int(h < size and top == 0)
            clipped["bottom"] += int(h < size and bottom == 31)
            clipped["left"] += int(w < size and left == 0)
            clipped["right"] += int(w < size and right == 31)
    assert full > n // 3
    assert min(clipped.values()) > 0, f"squares clip on one side only: {clipped}"


def torchvision_eval():
    import torchvision.transforms as T
    return T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])


def test_evaluation_equals_the_torchvision_eval_transform(tmp_path):
    images, labels = make_images(40, np.random.default_rng(0))
    reference = torch.stack([torchvision_eval()(Image.fromarray(im)) for im in images])
    for source, tolerance in (("memory", 1e-5), ("raw", 1e-5), ("jpeg", None)):
        out = torch.cat([x for x, _ in dali_loader(config(tmp_path), splits((images, labels)), source).test])
        if tolerance:
            torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)
        else:  # JPEG q95 is lossy: a few grey levels on these noisy images (docs/DALI.md)
            error = (pixels(out) - pixels(reference)).abs()
            assert error.mean() < 5 and error.max() < 40


def test_derived_files_are_reused_and_rebuilt_when_a_pixel_changes(tmp_path):
    cfg = config(tmp_path)
    images, _ = identity_images(20)
    files = derived.derived_files(cfg, images, "raw")
    marker = os.path.join(os.path.dirname(files[0]), "marker")
    open(marker, "w").close()
    assert derived.derived_files(cfg, images, "raw") == files and os.path.exists(marker)

    changed = images.copy()
    changed[3, 0, 0, 0] += 1
    rebuilt = derived.derived_files(cfg, changed, "raw")
    assert os.path.dirname(rebuilt[0]) != os.path.dirname(files[0])
    assert np.fromfile(rebuilt[3], np.uint8).reshape(32, 32, 3)[0, 0, 0] == changed[3, 0, 0, 0]


def test_a_failed_build_leaves_no_cache_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    def fail(path, image):
        raise OSError("disk full")
    monkeypatch.setattr(derived, "_write_raw", fail)
    with pytest.raises(OSError):
        derived.derived_files(config(tmp_path), identity_images(5)[0], "raw")
    assert os.listdir(tmp_path / "cache" / "cifar-harness" / derived.CACHE) == []
    assert sorted(os.listdir(tmp_path)) == ["cache"], "a derived file went into the data folder"


def test_unknown_source_and_missing_dali_are_one_line_user_errors(monkeypatch):
    with pytest.raises(UserError, match="memory, raw, jpeg, files"):
        resolve_source("png")
    monkeypatch.setitem(__import__("sys").modules, "nvidia.dali", None)
    with pytest.raises(UserError, match="pip install nvidia-dali"):
        require_dali()
    with pytest.raises(UserError, match="--mode ddp_dali needs NVIDIA DALI"):
        get_DALI_loader(8, 8, splits=splits(identity_images(10)))


@pytest.mark.gpu
@pytest.mark.skipif(cuda_status()[0] == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("source", ["memory", "raw", "jpeg"])
def test_gpu_pipeline_matches_the_cpu_pipeline(tmp_path, source):
    images, labels = make_images(40, np.random.default_rng(0))
    outputs = []
    for use_cuda in (False, True):
        cfg = config(tmp_path, use_cuda=use_cuda)
        batches = list(dali_loader(cfg, splits((images, labels)), source).test)
        device = "cuda" if use_cuda else "cpu"
        assert all(x.device.type == device and y.device == x.device for x, y in batches)
        outputs.append(pixels(torch.cat([x for x, _ in batches])))
    # nvJPEG and libjpeg-turbo may round their inverse DCTs differently by a level or two.
    torch.testing.assert_close(outputs[1], outputs[0], atol=3 if source == "jpeg" else 1e-3, rtol=0)


def png_pass(loader):
    """(labels, per-image pixel sums) of one pass, in the order the loader yields them."""
    labels, sums = [], []
    for images, y in loader:
        labels += y.tolist()
        sums += pixels(images).sum(dim=(1, 2, 3)).round().long().tolist()
    return labels, sums


def test_the_labs_reset_and_a_new_pass_go_on_to_the_next_epoch_and_set_epoch_replays_one(tmp_path):
    """The lab's loop calls reset() after each epoch and never set_epoch: each epoch must still
    be a new order with new crops (issue 39, defect 5). Before: reset() rebuilt epoch 0."""
    from tests.lab.test_lab_kit import write_layouts
    tree = write_layouts(tmp_path)["ddp_dali"]  # 10 classes, 40 training PNGs
    _, train, _ = get_DALI_loader(5, 4, root=tree, cutout=8, num_workers=1, download=False, rank=0, world_size=1)
    epoch0 = png_pass(train)
    train.reset()
    epoch1 = png_pass(train)
    epoch2 = png_pass(train)  # a new pass without reset() goes on as well
    assert epoch1 != epoch0 and epoch2 not in (epoch0, epoch1), "an epoch replayed an earlier one"
    assert sorted(epoch1[0]) == sorted(epoch0[0]) == sorted(epoch2[0]), "every image once per pass"
    _, resumed, _ = get_DALI_loader(5, 4, root=tree, cutout=8, num_workers=1, download=False, rank=0, world_size=1)
    resumed.set_epoch(1)
    assert png_pass(resumed) == epoch1, "set_epoch(1) must replay epoch 1 exactly"
    train.set_epoch(2)
    assert png_pass(train) == epoch2
