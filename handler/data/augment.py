"""The torchvision training/evaluation transforms. The DALI pipeline mirrors them exactly."""
import torch
import torchvision.transforms as T

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4


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


def train_transform(cutout: int = 0):
    steps = [T.RandomCrop(32, padding=PAD), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    if cutout:
        steps.append(Cutout(cutout))
    return T.Compose(steps)


def eval_transform():
    return T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
