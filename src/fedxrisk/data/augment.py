"""Image augmentation on tensors, without torchvision: random crop with zero padding, horizontal flip.

The standard CIFAR recipe (pad 4, random 32×32 crop, flip with probability ½) applied
per sample to a whole batch at once. Randomness comes from a NumPy generator owned
by the augmenter (seeded), never from torch's global state, so runs are reproducible.
Use it by setting ``FederatedData.augment``; engines then augment every training batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def crop(x: torch.Tensor, padding: int, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Crop each image of ``x`` ``[N, C, H, W]`` from its zero-padded version at offset (dy, dx) ∈ [0, 2p]²."""
    n, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, :, None]  # [N, H, 1]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, :]  # [N, 1, W]
    picked = padded.permute(0, 2, 3, 1)[torch.arange(n, device=x.device)[:, None, None], rows, cols]
    return picked.permute(0, 3, 1, 2)


def flip(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror the images where ``mask`` (``[N]`` bool) is set."""
    return torch.where(mask[:, None, None, None], x.flip(-1), x)


class RandomCropFlip:
    """Random crop after ``padding`` zero pixels on each side, then a flip with probability ``flip_prob``."""

    def __init__(self, padding: int = 4, flip_prob: float = 0.5, seed: int = 0):
        if padding < 0 or not 0.0 <= flip_prob <= 1.0:
            raise ValueError(f"padding must be ≥ 0 and flip_prob in [0, 1], got {padding}, {flip_prob}")
        self.padding, self.flip_prob = padding, flip_prob
        self.rng = np.random.default_rng([seed, 7])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Augment images ``[..., C, H, W]`` (any leading axes, e.g. clients × batch)."""
        if x.dim() < 4:
            raise ValueError(f"augmentation needs images [..., C, H, W], got shape {tuple(x.shape)}")
        return self.apply(x, self.draw(int(np.prod(x.shape[:-3]))))

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The random offsets (dy, dx) and flip mask of ``n`` images: the only RNG use, so the
        draws can be made in one process and applied in another (streaming workers)."""
        dy, dx = (self.rng.integers(0, 2 * self.padding + 1, n) for _ in range(2))
        return dy, dx, self.rng.random(n) < self.flip_prob

    def apply(self, x: torch.Tensor, params: tuple[np.ndarray, np.ndarray, np.ndarray]) -> torch.Tensor:
        """Crop and flip images ``[..., C, H, W]`` with drawn ``params`` (no randomness)."""
        lead, flat = x.shape[:-3], x.reshape(-1, *x.shape[-3:])
        dy, dx, mask = (torch.from_numpy(p).to(x.device) for p in params)
        return flip(crop(flat, self.padding, dy, dx), mask).reshape(*lead, *x.shape[-3:])
