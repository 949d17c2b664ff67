"""The training/evaluation transforms: pad-4 random crop, horizontal flip, to [0, 1], normalise,
optional Cutout. `crop_flip` is the one reference for the crop and flip: the DALI pipeline
(handler/DALI/pipeline.py) does them in its own operators, and tests/training/test_dali_loader.py
holds both of its ways against `crop_flip`.

They equal torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize
bit for bit, drawing the same random numbers in the same order (tests/training/test_data.py
holds them side by side), but work on the uint8 HWC arrays directly. Importing torchvision
costs every process 1.7 s on a 2-core box (it pulls in torch._dynamo through torchvision.ops),
and every rank, loader worker and test start pays it; these four steps do not need it.
"""
import numpy as np
import torch

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4


def crop_flip(img: np.ndarray, top: int, left: int, flip: bool) -> np.ndarray:
    """RandomCrop(32, padding=PAD)'s window at (top, left) of the image zero-padded by PAD on
    every side (top, left in 0..2*PAD, drawn uniformly), then RandomHorizontalFlip's mirror
    when `flip` (drawn with p = 0.5). uint8 HWC in, uint8 HWC out."""
    h, w = img.shape[:2]
    padded = np.pad(img, ((PAD, PAD), (PAD, PAD), (0, 0)))
    window = padded[top:top + h, left:left + w]
    return window[:, ::-1] if flip else window


class Cutout:
    """Zero a size x size square (after normalisation, i.e. set it to the mean).

    The centre is uniform over the image, so the square may be clipped at the border,
    as in DeVries & Taylor (2017).
    """

    def __init__(self, size: int):
        self.size = size

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.shape[-2:]
        cy, cx = torch.randint(h, (1,)).item(), torch.randint(w, (1,)).item()
        y0, x0 = max(cy - self.size // 2, 0), max(cx - self.size // 2, 0)
        img[..., y0:cy + (self.size + 1) // 2, x0:cx + (self.size + 1) // 2] = 0
        return img


class _Normalised:
    """uint8 HWC -> float32 CHW in [0, 1] -> (x - MEAN) / STD, as ToTensor + Normalize do it."""

    mean = torch.tensor(MEAN).view(-1, 1, 1)
    std = torch.tensor(STD).view(-1, 1, 1)

    def tensor(self, img: np.ndarray) -> torch.Tensor:
        chw = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).contiguous()
        return chw.to(torch.float32).div(255).sub_(self.mean).div_(self.std)


class EvalTransform(_Normalised):
    def __call__(self, img: np.ndarray) -> torch.Tensor:
        return self.tensor(img)


class TrainTransform(_Normalised):
    def __init__(self, cutout: int = 0):
        self.cutout = Cutout(cutout) if cutout else None

    def __call__(self, img: np.ndarray) -> torch.Tensor:
        top = int(torch.randint(0, 2 * PAD + 1, size=(1,)).item())  # RandomCrop.get_params' two draws
        left = int(torch.randint(0, 2 * PAD + 1, size=(1,)).item())
        flip = bool(torch.rand(1) < 0.5)  # RandomHorizontalFlip's draw
        out = self.tensor(crop_flip(img, top, left, flip))
        return self.cutout(out) if self.cutout else out


def train_transform(cutout: int = 0) -> TrainTransform:
    return TrainTransform(cutout)


def eval_transform() -> EvalTransform:
    return EvalTransform()
