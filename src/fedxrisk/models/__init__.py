"""Model zoo: ``build_model(name, input_shape, seed, num_outputs)``.

A model is any ``nn.Module`` mapping ``[B, *input_shape]`` to ``[B, num_outputs]``
logits (one per label); register a constructor ``(input_shape, num_outputs=1)``
in :data:`MODELS` to use it by name, or pass the module to :class:`~fedxrisk.problem.Problem`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from fedxrisk.models.cnn1d import CNN1D
from fedxrisk.models.cnn28 import CNN28
from fedxrisk.models.densenet import DenseNet, densenet121, densenet121_imagenet, densenet161
from fedxrisk.models.resnet import ResNet, resnet20
from fedxrisk.models.small import MLP, Linear, SmallCNN

MODELS: dict[str, Callable[..., nn.Module]] = {
    "linear": Linear,
    "mlp": MLP,
    "cnn": SmallCNN,
    "cnn28": CNN28,
    "cnn1d": CNN1D,
    "resnet20": resnet20,
    "densenet121": densenet121,
    "densenet121_imagenet": densenet121_imagenet,
    "densenet161": densenet161,
}


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    seed: int = 0,
    num_outputs: int = 1,
    normalize: Mapping[str, Sequence[float]] | None = None,
) -> nn.Module:
    """Instantiate a registered model with weights drawn from ``seed``; ``num_outputs`` = labels;
    ``normalize``: per-channel ``{"mean", "std"}`` applied to its inputs (:func:`normalize_inputs`)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if num_outputs == 1:
            model = MODELS[name](input_shape)
        else:
            model = MODELS[name](input_shape, num_outputs=num_outputs)
    return model if normalize is None else normalize_inputs(model, normalize["mean"], normalize["std"])


def normalize_inputs(model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> nn.Module:
    """``model`` that first maps each input channel to ``(x - mean) / std``: a forward pre-hook
    with constant tensors, so parameter names, buffers and saved weights are unchanged."""
    m = torch.tensor(list(mean), dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(list(std), dtype=torch.float32).view(-1, 1, 1)

    def hook(module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        return ((x - m.to(x.device, x.dtype)) / s.to(x.device, x.dtype), *args[1:])

    model.register_forward_pre_hook(hook)
    return model


__all__ = [
    "CNN1D",
    "CNN28",
    "MLP",
    "MODELS",
    "DenseNet",
    "Linear",
    "ResNet",
    "SmallCNN",
    "build_model",
    "densenet121",
    "densenet121_imagenet",
    "densenet161",
    "normalize_inputs",
    "resnet20",
]
