"""The course kit's train_cifar.py flow, driven through the lab's own functions as the kit calls
them: run_process(main_func, args) starts args.num_gpu processes, each calls
initialize_group(proc_id, ip, port, num_gpu), get_DDP_loader or get_DALI_loader(root=...),
model_to_DDP(model), trains one epoch, and destroy_process(). docs/LAB.md has the kit's flow;
scripts/gpu_check_plan.py runs this as its `lab-style driver` rows (NCCL on 2 GPUs).

    python scripts/kit_driver.py --mode ddp_dali --num_gpu 2 --data TREE --out DIR [--expect-backend nccl]

Checks, on each rank's records: every training image seen exactly once across the ranks, every
label with its image, every test image once, steps == len(train_loader), a finite loss, the
batches on the rank's own device and the expected backend. Exit 0 with one PASS line, or 1 with
one line naming what failed. `write_png_tree` makes the kit's PNG tree (gpu_check makes one on
the fly for its `ddp_dali files` rows too).
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRAIN_BATCH, TEST_BATCH = 16, 50  # per process, as the kit's loaders take them


def identity_images(first: int, n: int):
    """Flat images whose colour encodes their index (R, G) and label (B): every crop and flip
    keeps the centre pixel, so a batch tells which images it holds."""
    import numpy as np
    ids = np.arange(first, first + n)
    labels = ids % 10
    colours = np.stack([ids % 256, ids // 256, labels * 20], axis=1).astype(np.uint8)
    return np.broadcast_to(colours[:, None, None, :], (n, 32, 32, 3)).copy(), labels.astype(np.int64)


def write_png_tree(root: Path, n_train: int, n_test: int) -> Path:
    """The kit's layout: root/{train,test}/<class name>/<n>.png, and `valid` left empty."""
    from PIL import Image
    from handler.data.cifar_images import SPLITS
    from handler.data.synthetic import CLASSES
    for split, first, n in ((SPLITS[0], 0, n_train), (SPLITS[2], n_train, n_test)):
        images, labels = identity_images(first, n)
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{first + i}.png")
    (root / "valid").mkdir(parents=True, exist_ok=True)
    return root


def decoded_ids(images) -> List[int]:
    """The index each normalised image encodes, read from its centre pixel."""
    import torch
    from handler.data.augment import MEAN, STD
    centre = images[:, :, 16, 16].float().cpu() * torch.tensor(STD) * 255 + torch.tensor(MEAN) * 255
    rgb = centre.round().long()
    return (rgb[:, 0] + 256 * rgb[:, 1]).tolist()


def main_func(proc_id: int, args: argparse.Namespace) -> None:
    """The kit's main_func, written the lab's way; its record goes to OUT/rank<proc_id>.json."""
    import torch
    from torch import nn
    from handler.DDP.model import model_to_DDP
    from handler.DDP.utils import destroy_process, initialize_group
    rank = initialize_group(proc_id, args.ip, args.port, args.num_gpu)
    try:
        if args.mode == "ddp_dali":
            from handler.DALI.cifar10_loader import get_DALI_loader as get_loader
        else:
            from handler.DDP.cifar10_loader import get_DDP_loader as get_loader
        test_loader, train_loader, _ = get_loader(root=args.data, test_batch=TEST_BATCH, train_batch=TRAIN_BATCH,
                                                  cutout=0, num_workers=1, download=False)
        torch.manual_seed(0)
        model = model_to_DDP(nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Flatten(),
                                           nn.Linear(8 * 15 * 15, 10)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        seen, mislabelled, losses, devices = [], 0, [], set()
        for images, labels in train_loader:
            ids = decoded_ids(images)
            mislabelled += sum(i % 10 != label for i, label in zip(ids, labels.tolist()))
            seen += ids
            devices.add(str(images.device))
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        tested = [i for images, _ in test_loader for i in decoded_ids(images)]
        record = {"seen": seen, "mislabelled": mislabelled, "steps": len(losses), "len": len(train_loader),
                  "tested": tested, "loss": losses[-1] if losses else math.nan, "devices": sorted(devices),
                  "device": rank.device, "backend": rank.backend}
        (Path(args.out) / f"rank{proc_id}.json").write_text(json.dumps(record))
    finally:
        destroy_process()


def verdict(records: List[dict], n_train: int, n_test: int, expect_backend: Optional[str]) -> str:
    """"" when the ranks trained as the kit means, else the first thing that was not so."""
    seen = sorted(i for r in records for i in r["seen"])
    tested = sorted(i for r in records for i in r["tested"])
    checks: List[Tuple[bool, str]] = [
        (seen == list(range(n_train)), f"{len(seen)} training images seen ({len(set(seen))} distinct), not each of "
                                       f"{n_train} once"),
        (tested == list(range(n_train, n_train + n_test)), f"{len(tested)} test images, not each of {n_test} once"),
        (all(r["mislabelled"] == 0 for r in records), "labels do not follow their images"),
        (all(r["steps"] == r["len"] for r in records), "steps differ from len(train_loader)"),
        (all(math.isfinite(r["loss"]) for r in records), "the loss is not finite"),
        (all(r["devices"] == [r["device"]] for r in records), "a batch was not on its rank's device"),
        (expect_backend is None or all(r["backend"] == expect_backend for r in records),
         f"backend {records[0]['backend'] if records else '?'}, expected {expect_backend}"),
    ]
    return next((why for ok, why in checks if not ok), "")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--mode", choices=("ddp", "ddp_dali"), default="ddp_dali")
    p.add_argument("--num_gpu", type=int, default=2)
    p.add_argument("--data", required=True, help="the kit's PNG tree (write_png_tree)")
    p.add_argument("--out", required=True, help="folder for each rank's record")
    p.add_argument("--expect-backend", choices=("nccl", "gloo"), default=None)
    args = p.parse_args(argv)
    import socket
    from handler.DDP.utils import run_process
    from handler.data.cifar_images import SPLITS
    from handler.runtime.errors import one_line_errors
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:  # the kit's free port: chosen here, bound by rank 0 (tcp:// rendezvous)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with one_line_errors():
        run_process(main_func, argparse.Namespace(**vars(args), ip="127.0.0.1", port=port))
    records = [json.loads((Path(args.out) / f"rank{r}.json").read_text()) for r in range(args.num_gpu)]
    n_train, n_test = (sum(1 for _ in (Path(args.data) / split).rglob("*.png")) for split in (SPLITS[0], SPLITS[2]))
    why = verdict(records, n_train, n_test, args.expect_backend)
    if why:
        print(f"kit_driver: FAIL {args.mode} on {args.num_gpu} process(es): {why}", file=sys.stderr)
        return 1
    print(f"kit_driver: PASS {args.mode} on {args.num_gpu} process(es) over {records[0]['backend']}: {n_train} "
          f"training images each seen once, {n_test} test images, {records[0]['steps']} steps a rank")
    return 0

if __name__ == "__main__":
    sys.exit(main())
