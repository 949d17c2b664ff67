"""Model registry. Models are plain nn.Modules: they never know how they are parallelized."""
from typing import Callable, Dict

from .fastnet import fastnet
from .resnet import resnet18, resnet20
from .staged import StagedModel

MODELS: Dict[str, Callable[..., StagedModel]] = {
    "resnet18": resnet18,
    "resnet20": resnet20,
    "fastnet": fastnet,
}


def build_model(name: str, num_classes: int) -> StagedModel:
    return MODELS[name](num_classes=num_classes)
