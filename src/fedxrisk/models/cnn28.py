"""A LeNet-style CNN for 28×28 grayscale images (MNIST, FashionMNIST), one logit per label."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CNN28(nn.Module):
    """conv5(32)–pool–conv5(64)–pool–fc(128)–fc(outputs), ReLU; no BatchNorm."""

    head_name = "fc2"

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int = 1):
        super().__init__()
        if len(input_shape) != 3 or input_shape[1] < 12 or input_shape[2] < 12:
            raise ValueError(f"cnn28 needs C×H×W images of at least 12×12, got input shape {input_shape}")
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        hh, ww = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(64 * hh * ww, 128)
        self.fc2 = nn.Linear(128, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))
