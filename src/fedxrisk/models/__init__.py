"""Model zoo: ``build_model(name, input_shape, seed)``; any ``nn.Module`` with one logit works."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedxrisk.models.small import MLP, Linear, SmallCNN

MODELS: dict[str, Callable[[tuple[int, ...]], nn.Module]] = {
    "linear": Linear,
    "mlp": MLP,
    "cnn": SmallCNN,
}


def build_model(name: str, input_shape: tuple[int, ...], seed: int = 0) -> nn.Module:
    """Instantiate a registered model with weights drawn from ``seed``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](input_shape)


__all__ = ["MLP", "MODELS", "Linear", "SmallCNN", "build_model"]
