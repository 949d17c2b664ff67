"""CIFAR-10's python-batch layout on disk: read it, write it, download it.

Any directory with `data_batch_1..5`, `test_batch` and `batches.meta` is accepted,
whatever the number of images per batch, so relabelled or custom sets just work.
"""
import os
import pickle
from dataclasses import dataclass
from typing import List

import numpy as np

from ..runtime.errors import UserError

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
URL = os.environ.get("CIFAR10_URL", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz")
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"


@dataclass(frozen=True)
class CifarArrays:
    """Images as uint8 NHWC, labels as int64."""
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: List[str]


def has_layout(root: str) -> bool:
    folder = os.path.join(root, FOLDER)
    return all(os.path.isfile(os.path.join(folder, f)) for f in (*TRAIN_FILES, TEST_FILE, META_FILE))


def _get(d: dict, key: str):
    return d[key] if key in d else d[key.encode()]


def _load_pickle(path: str) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"{path} is missing; the CIFAR layout needs {', '.join(TRAIN_FILES)}, "
                        f"{TEST_FILE} and {META_FILE} (re-download, or use --dataset synthetic)")
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="latin1")
    except Exception as err:  # truncated files raise EOFError, garbage raises UnpicklingError, ...
        raise UserError(f"{path} is truncated or corrupt ({type(err).__name__}); delete it and "
                        f"re-download CIFAR-10, or regenerate it") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} is not a CIFAR batch (no dict inside); check the data folder")
    return obj


def _read_batch(path: str, num_classes: int):
    batch = _load_pickle(path)
    try:
        data = np.asarray(_get(batch, "data"), dtype=np.uint8)
        labels = np.asarray(_get(batch, "labels"), dtype=np.int64)
    except KeyError:
        raise UserError(f"{path} has no 'data'/'labels' entries; it is not a CIFAR batch") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise UserError(f"{path} holds data of shape {data.shape} and {len(labels)} labels; "
                        "expected (N, 3072) and N labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise UserError(f"{path} has labels outside 0..{num_classes - 1} "
                        f"(batches.meta lists {num_classes} classes)")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def read_cifar(root: str) -> CifarArrays:
    folder = os.path.join(root, FOLDER)
    meta = _load_pickle(os.path.join(folder, META_FILE))
    try:
        classes = [c.decode() if isinstance(c, bytes) else str(c) for c in _get(meta, "label_names")]
    except KeyError:
        raise UserError(f"{folder}/{META_FILE} has no label_names; it is not CIFAR metadata") from None
    train = [_read_batch(os.path.join(folder, f), len(classes)) for f in TRAIN_FILES]
    test_x, test_y = _read_batch(os.path.join(folder, TEST_FILE), len(classes))
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    if len(test_y) == 0:
        raise UserError(f"{folder}/{TEST_FILE} holds no images; a test set needs at least one")
    if len(train_y) < 2:
        raise UserError(f"{folder} holds {len(train_y)} training image(s); training needs at least 2")
    return CifarArrays(train_x, train_y, test_x, test_y, classes)


def write_cifar(root: str, train_x, train_y, test_x, test_y, classes) -> None:
    """Write arrays (uint8 NHWC) in the CIFAR layout; the train set is split into 5 batches."""
    folder = os.path.join(root, FOLDER)
    os.makedirs(folder, exist_ok=True)

    def dump(name, x, y):
        flat = np.ascontiguousarray(x.transpose(0, 3, 1, 2)).reshape(len(x), -1)
        batch = {"batch_label": name, "labels": [int(v) for v in y], "data": flat,
                 "filenames": [f"{name}_{i}.png" for i in range(len(x))]}
        tmp = os.path.join(folder, name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(batch, f, protocol=4)
        os.replace(tmp, os.path.join(folder, name))

    for name, idx in zip(TRAIN_FILES, np.array_split(np.arange(len(train_x)), len(TRAIN_FILES))):
        dump(name, train_x[idx], train_y[idx])
    dump(TEST_FILE, test_x, test_y)
    meta = {"label_names": list(classes), "num_cases_per_batch": -(-len(train_x) // 5), "num_vis": 3072}
    with open(os.path.join(folder, META_FILE), "wb") as f:
        pickle.dump(meta, f, protocol=4)


def download_cifar(root: str, timeout_s: float = 30.0) -> None:
    """Fetch and md5-check the official archive with torchvision's utilities."""
    import socket
    from torchvision.datasets.utils import download_and_extract_archive

    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)
    try:
        download_and_extract_archive(URL, download_root=root, md5=ARCHIVE_MD5)
    finally:
        socket.setdefaulttimeout(old)
