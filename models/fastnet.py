"""FastNet: a small, wide VGG-style net after KellerJordan/cifar10-airbench.

Three conv groups (conv, max-pool, BN, GELU, conv, BN, GELU), global max-pool and a
scaled linear head. Meant for a fast recipe (about 10 epochs); see docs/GPU_CHECK.md ("GPU status") for
its status: the time-to-accuracy target is recorded there, not guessed here.
"""
from typing import List

import torch.nn as nn

from .staged import StagedModel


def _conv_bn(cin: int, cout: int, pool: bool = False) -> nn.Sequential:
    layers: List[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.BatchNorm2d(cout), nn.GELU())


class FastNet(StagedModel):
    def __init__(self, widths=(64, 256, 256, 256), num_classes: int = 10, head_scale: float = 1 / 9):
        super().__init__()
        self.stem = _conv_bn(3, widths[0])
        self.stages = nn.ModuleList(
            nn.Sequential(_conv_bn(cin, cout, pool=True), _conv_bn(cout, cout))
            for cin, cout in zip(widths[:-1], widths[1:]))
        self.head = nn.Linear(widths[-1], num_classes, bias=False)
        self.head_scale = head_scale

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.forward_head(x)

    def forward_head(self, x):
        """Pool and classify the last stage's features (pipeline stages call it alone)."""
        return self.head(x.amax(dim=(2, 3))) * self.head_scale


def fastnet(num_classes: int = 10) -> FastNet:
    return FastNet(num_classes=num_classes)
