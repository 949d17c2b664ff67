"""Model registry. Models are plain nn.Modules: they never know how they are parallelized."""
from typing import Callable, Dict

import torch.nn as nn

from .fastnet import fastnet
from .resnet import resnet18, resnet20

MODELS: Dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet20": resnet20,
    "fastnet": fastnet,
}


def build_model(name: str, num_classes: int) -> nn.Module:
    return MODELS[name](num_classes=num_classes)
