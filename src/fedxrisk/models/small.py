"""Small models for bundled data: linear, MLP, and a BatchNorm CNN. All output one logit."""

from __future__ import annotations

import math

import torch
from torch import nn


class Linear(nn.Module):
    """Logistic-regression scorer on flattened inputs."""

    head_name = "fc"  # the classifier head (``model.reset_head``)

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int = 1):
        super().__init__()
        self.fc = nn.Linear(math.prod(input_shape), num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs."""

    def __init__(
        self, input_shape: tuple[int, ...], num_outputs: int = 1, hidden: tuple[int, ...] = (64, 64)
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_outputs))
        self.net = nn.Sequential(*layers)
        self.head_name = f"net.{len(layers) - 1}"  # the classifier head (``model.reset_head``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class SmallCNN(nn.Module):
    """Two conv–BatchNorm–ReLU blocks and a linear head, for C×H×W inputs (e.g. 1×8×8 digits)."""

    head_name = "head"

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int = 1, channels: int = 16):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"cnn needs C×H×W inputs, got shape {input_shape}")
        c = input_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(8 * channels, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))
