"""A small 1-D convolutional network for signals (e.g. MNIST-1D, length 40).

MNIST-1D is built so that fully connected networks stall and convolutions
succeed (Greydanus 2020: ~94 % ten-class accuracy for a three-layer CNN versus
~68 % for an MLP). Three stride-2 convolutions with ReLU, then one linear head;
no BatchNorm, so every buffer policy and engine treats it alike.
"""

from __future__ import annotations

import torch
from torch import nn


class CNN1D(nn.Module):
    """Input ``[B, L]`` or ``[B, C, L]``; output ``[B, num_outputs]`` logits."""

    head_name = "head"  # the classifier head (``model.reset_head``)

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int = 1, channels: int = 32):
        super().__init__()
        if len(input_shape) not in (1, 2):
            raise ValueError(f"cnn1d needs L or C×L inputs, got shape {input_shape}")
        c, length = (1, input_shape[0]) if len(input_shape) == 1 else input_shape
        self.features = nn.Sequential(
            nn.Conv1d(c, channels, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        for _ in range(3):
            length = (length + 1) // 2  # each stride-2 layer above halves L, rounding up
        self.head = nn.Linear(channels * length, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        return self.head(self.features(x).flatten(1))
