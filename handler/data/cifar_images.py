"""CIFAR-10 as a tree of PNG files, the layout the course kit writes for DALI:
`ROOT/{train,valid,test}/<class name>/<n>.png`.

A class's index is its folder's place among the split's class folders in sorted order, as
DALI's fn.readers.file(file_root=...) numbers them. CIFAR-10's class names (torchvision's,
which the kit writes) sort into CIFAR-10's own label order, so the two agree. A tree with
other names gets a warning that its labels follow the sorted names, and so do a class with no
training images and a valid/ or test/ class missing from train/ (tree_warnings). `valid` may
be empty (the kit's default): the validation images are then held out of `train` (--valid-size).
Nothing is ever written into the tree: its decoded pixels are kept in `cache_root()`.
"""
import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from ..runtime.errors import UserError
from .synthetic import CLASSES

SPLITS = ("train", "valid", "test")  # the kit's folder names
EXTENSIONS = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class ImageSplit:
    """One split's files, their labels (int64), and the class names in label order."""
    files: List[str]
    labels: np.ndarray
    classes: List[str]


def has_image_tree(root: str) -> bool:
    """ROOT/train and ROOT/test each hold at least one class folder."""
    return all(_class_folders(os.path.join(root, split)) for split in SPLITS if split != "valid")


def _class_folders(folder: str) -> List[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))


def list_split(folder: str, classes: List[str]) -> ImageSplit:
    """The split's image files in DALI's order (class folders, then file names, sorted)."""
    files, labels = [], []
    for label, name in enumerate(classes):
        class_dir = os.path.join(folder, name)
        if not os.path.isdir(class_dir):
            continue
        names = sorted(f for f in os.listdir(class_dir) if f.lower().endswith(EXTENSIONS))
        files += [os.path.join(class_dir, f) for f in names]
        labels += [label] * len(names)
    return ImageSplit(files, np.asarray(labels, dtype=np.int64), classes)


def tree_classes(root: str) -> List[str]:
    """The class names, in label order: ROOT/train's folders, sorted."""
    return _class_folders(os.path.join(root, "train"))


def tree_warnings(root: str, classes: List[str]) -> Tuple[List[str], Dict[str, int]]:
    """What a run on this tree must be told, one line each, and the images it leaves out
    ({"test/horse": 12}): class names other than CIFAR-10's (labels follow the sorted names),
    a class whose train/ folder holds no image (trained on nothing, tested all the same), and
    a valid/ or test/ folder with no class in train/ (its images have no label: left out)."""
    warnings = []
    if classes != CLASSES:
        warnings.append(f"{root}/train's class folders ({', '.join(classes)}) are not CIFAR-10's "
                        f"({', '.join(CLASSES)}); label k is the k-th folder in sorted order")
    for name in classes:
        if not _images_in(os.path.join(root, "train", name)):
            tested = _images_in(os.path.join(root, "test", name))
            warnings.append(f"class {name} has no training images ({root}/train/{name}/ holds none): the model never "
                            f"learns it, and its {tested} test images count as misses; add its images, or "
                            "rebuild the tree with the kit's scripts/init.sh")
    left_out = {}
    for split in SPLITS[1:]:
        for name in _class_folders(os.path.join(root, split)):
            count = _images_in(os.path.join(root, split, name))
            if name not in classes and count:
                left_out[f"{split}/{name}"] = count
                warnings.append(f"class {name} has no folder in {root}/train/, so its {count} {split} images "
                                f"({root}/{split}/{name}/) are left out: the model has no label for them; add "
                                f"{root}/train/{name}/, or rebuild the tree with the kit's scripts/init.sh")
    return warnings, left_out


def _images_in(folder: str) -> int:
    if not os.path.isdir(folder):
        return 0
    return sum(f.lower().endswith(EXTENSIONS) for f in os.listdir(folder))


def cache_root() -> str:
    """Where files derived from a dataset go, never into the dataset's folder:
    $XDG_CACHE_HOME/cifar-harness, else ~/.cache/cifar-harness."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cifar-harness")


def read_split(split: ImageSplit) -> Tuple[np.ndarray, np.ndarray]:
    """The split's files decoded into uint8 NHWC arrays (32x32 RGB each). The pixels are kept
    under cache_root()/png_arrays, keyed by the files' paths, sizes and times, so every rank
    and later run reads one array instead of decoding every PNG again."""
    digest = hashlib.sha1()
    for path in split.files:
        stat = os.stat(path)
        digest.update(f"{os.path.abspath(path)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    cached = os.path.join(cache_root(), "png_arrays", digest.hexdigest()[:20] + ".npy")
    if os.path.isfile(cached):
        return np.load(cached), split.labels
    images = _decode(split.files)
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(cached), suffix=".npy")
    with os.fdopen(fd, "wb") as f:
        np.save(f, images)
    os.replace(tmp, cached)  # whole or absent: ranks that decode at once write the same bytes
    return images, split.labels


def _decode(files: List[str]) -> np.ndarray:
    from PIL import Image

    images = np.zeros((len(files), 32, 32, 3), np.uint8)
    for i, path in enumerate(files):
        try:
            with Image.open(path) as img:
                pixels = np.asarray(img.convert("RGB"))
        except OSError as err:  # PIL's UnidentifiedImageError, a truncated file
            raise UserError(f"{path} is not a readable image ({type(err).__name__}); replace it, or rebuild "
                            "the PNG tree with the kit's scripts/init.sh") from None
        if pixels.shape != (32, 32, 3):
            raise UserError(f"{path} is {pixels.shape[1]}x{pixels.shape[0]}; CIFAR-10 images are 32x32")
        images[i] = pixels
    return images
