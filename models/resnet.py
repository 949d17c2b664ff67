"""CIFAR ResNets: ResNet-18 with a 3x3 stem and no max-pool, and He et al. (2016) ResNet-20."""
import torch.nn as nn
import torch.nn.functional as F

from .staged import StagedModel


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, shortcut: str):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = _projection(cin, cout, stride) if shortcut == "B" else _PadShortcut(cout - cin, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _projection(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class _PadShortcut(nn.Module):
    """He et al.'s option A: subsample and zero-pad channels, no parameters."""

    def __init__(self, extra: int, stride: int):
        super().__init__()
        self.extra, self.stride = extra, stride

    def forward(self, x):
        x = x[:, :, ::self.stride, ::self.stride]
        half = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra - half))


class ResNet(StagedModel):
    """Stem, stages of BasicBlocks, global average pool, linear head.

    `stages` is a ModuleList so wrappers (activation checkpointing) can treat each stage alone.
    """

    def __init__(self, widths, depths, num_classes: int, shortcut: str):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        stages, cin = [], widths[0]
        for i, (width, depth) in enumerate(zip(widths, depths)):
            blocks = []
            for j in range(depth):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(cin, width, stride, shortcut))
                cin = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.forward_head(x)

    def forward_head(self, x):
        """Pool and classify the last stage's features (pipeline stages call it alone)."""
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet18(num_classes: int = 10) -> ResNet:
    return ResNet((64, 128, 256, 512), (2, 2, 2, 2), num_classes, shortcut="B")


def resnet20(num_classes: int = 10) -> ResNet:
    return ResNet((16, 32, 64), (3, 3, 3), num_classes, shortcut="A")
