"""ResNet20 for 32×32 images (He et al. 2016, §4.2, the CIFAR variant), one logit per label.

Three stages of three basic blocks with 16, 32 and 64 channels; stride-2
stages use the parameter-free "option A" shortcut (subsample, pad channels with
zeros), as in the paper's CIFAR experiments. 0.27 M parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.extra = stride, cout - cin

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.extra == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet-(6n+2): n blocks per stage; ``n=3`` is ResNet20."""

    head_name = "fc"  # the classifier head (``model.reset_head``)

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int = 1, blocks: int = 3, width: int = 16):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"resnet needs C×H×W images, got input shape {input_shape}")
        self.conv = nn.Conv2d(input_shape[0], width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        layers, cin = [], width
        for stage in range(3):
            cout = width * 2**stage
            for i in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_outputs)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(out.mean(dim=(2, 3)))


def resnet20(input_shape: tuple[int, ...], num_outputs: int = 1) -> ResNet:
    return ResNet(input_shape, num_outputs, blocks=3)
