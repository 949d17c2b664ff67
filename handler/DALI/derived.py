"""Files DALI reads, derived once from the CIFAR arrays (docs/DATA.md).

One file per image: `raw` holds the 32x32x3 uint8 pixels as they are (3072 bytes,
no decoding needed); `jpeg` holds a quality-95 4:4:4 JPEG, which nvJPEG can decode
on the GPU. A set lives in `CACHE/dali_cache/<format>-<key>/`, where the key hashes
the format and the split's pixels, so a changed dataset or split gets a new folder
and is never served stale. Labels are not stored: they travel with the file list.
CACHE is `$XDG_CACHE_HOME/cifar-harness` (default `~/.cache/cifar-harness`): never the
data folder, which may be the user's own (docs/LAB.md).
"""
import hashlib
import os
import shutil
import tempfile
from typing import List

import numpy as np
from PIL import Image

from ..data.cifar_images import cache_root
from ..runtime import rank0

FORMATS = {"raw": ".raw", "jpeg": ".jpg"}
JPEG_QUALITY = 95
CACHE = "dali_cache"


def derived_files(cfg, images: np.ndarray, fmt: str) -> List[str]:
    """Paths of one `fmt` file per image, building the set first if needed.

    Rank 0 builds while the other ranks wait; a rank that then still finds no set
    (a node without the shared disk) builds its own copy.
    """
    folder = os.path.join(cache_root(), CACHE, f"{fmt}-{content_key(images, fmt)}")
    with rank0.first(cfg):
        if not os.path.isdir(folder):
            _build(folder, images, fmt)
    return [os.path.join(folder, f"{i}{FORMATS[fmt]}") for i in range(len(images))]


def content_key(images: np.ndarray, fmt: str) -> str:
    digest = hashlib.sha1(f"{fmt} q{JPEG_QUALITY} {images.shape} {images.dtype}".encode())
    digest.update(np.ascontiguousarray(images).data)
    return digest.hexdigest()[:20]


def _build(folder: str, images: np.ndarray, fmt: str) -> None:
    """Write into a temporary folder, then rename: a killed build leaves no half set."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        write = _write_jpeg if fmt == "jpeg" else _write_raw
        for i, image in enumerate(images):
            write(os.path.join(tmp, f"{i}{FORMATS[fmt]}"), image)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(folder):  # losing a rename race to an identical build is fine
            raise


def _write_raw(path: str, image: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(image).data)


def _write_jpeg(path: str, image: np.ndarray) -> None:
    # 4:4:4 keeps full colour resolution: chroma subsampling would blur 32-pixel images badly.
    Image.fromarray(image).save(path, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
