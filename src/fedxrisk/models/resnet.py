"""ResNet20 for 32×32 inputs (He et al., 2016, §4.2: 3 stages of 3 basic blocks, 16/32/64 channels).

Minimal own implementation with one output logit; the downsampling shortcut is a
1×1 convolution with BatchNorm (the paper's option B).
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """conv3×3–BN–ReLU–conv3×3–BN plus shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet20 for C×32×32 images (any C×H×W works), one logit per row."""

    def __init__(self, input_shape: tuple[int, ...] = (3, 32, 32), width: int = 16):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"resnet20 needs C×H×W inputs, got shape {input_shape}")
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        cin = width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for i in range(3):
                blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.stem(x))
        return self.head(out.mean((2, 3)))
