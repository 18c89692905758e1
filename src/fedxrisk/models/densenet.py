"""DenseNet-121 and -161 (Huang et al. 2017), one logit per label; own code, no torchvision needed.

Module names follow torchvision's layout (``features.denseblock1.denselayer1.conv1``,
``features.transition1``, ``classifier``) so its ImageNet weights load directly:
``densenet121_imagenet`` reads them from a local file, never from the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

GROWTH, BN_SIZE, INIT_FEATURES = 32, 4, 64
BLOCKS_121 = (6, 12, 24, 16)
BLOCKS_161, GROWTH_161, INIT_FEATURES_161 = (6, 12, 36, 24), 48, 96
WEIGHTS_ENV = (
    "FEDXRISK_DENSENET121_WEIGHTS"  # path to a state dict (e.g. torchvision's densenet121-a639ec97.pth)
)
TORCHVISION_FILE = "densenet121-a639ec97.pth"


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int = GROWTH):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, BN_SIZE * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(BN_SIZE * growth)
        self.conv2 = nn.Conv2d(BN_SIZE * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.norm1(x)))
        return torch.cat([x, self.conv2(F.relu(self.norm2(out)))], 1)


class Transition(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.add_module("norm", nn.BatchNorm2d(cin))
        self.add_module("relu", nn.ReLU())
        self.add_module("conv", nn.Conv2d(cin, cout, 1, bias=False))
        self.add_module("pool", nn.AvgPool2d(2, 2))


class DenseNet(nn.Module):
    """ImageNet-style DenseNet (7×7 stem, max-pool, four dense blocks, BatchNorm-ReLU-pool head)."""

    head_name = "classifier"  # the classifier head (``model.reset_head``)

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int = 1,
        blocks: tuple[int, ...] = BLOCKS_121,
        growth: int = GROWTH,
        init_features: int = INIT_FEATURES,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"densenet needs C×H×W images, got input shape {input_shape}")
        feats = nn.Sequential()
        feats.add_module("conv0", nn.Conv2d(input_shape[0], init_features, 7, 2, 3, bias=False))
        feats.add_module("norm0", nn.BatchNorm2d(init_features))
        feats.add_module("relu0", nn.ReLU())
        feats.add_module("pool0", nn.MaxPool2d(3, 2, 1))
        width = init_features
        for i, n in enumerate(blocks, start=1):
            block = nn.Sequential()
            for j in range(n):
                block.add_module(f"denselayer{j + 1}", DenseLayer(width + j * growth, growth))
            feats.add_module(f"denseblock{i}", block)
            width += n * growth
            if i < len(blocks):
                feats.add_module(f"transition{i}", Transition(width, width // 2))
                width //= 2
        feats.add_module("norm5", nn.BatchNorm2d(width))
        self.features = feats
        self.classifier = nn.Linear(width, num_outputs)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.features(x))
        return self.classifier(out.mean(dim=(2, 3)))

    @staticmethod
    def adapt_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """torchvision's original checkpoints name layers ``norm.1``; ours (and its modules) ``norm1``."""
        return {OLD_KEY.sub(lambda m: m.group(1) + m.group(2), k): v for k, v in state.items()}


OLD_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$"
)


def densenet121(input_shape: tuple[int, ...], num_outputs: int = 1) -> DenseNet:
    """DenseNet-121, randomly initialized (7.0 M parameters with one output)."""
    return DenseNet(input_shape, num_outputs)


def densenet161(input_shape: tuple[int, ...], num_outputs: int = 1) -> DenseNet:
    """DenseNet-161 (growth 48, 96 stem features), randomly initialized; torchvision's layout, so
    its ImageNet state dict loads with ``model.init_from`` (and ``reset_head`` for 1000 classes)."""
    return DenseNet(input_shape, num_outputs, BLOCKS_161, GROWTH_161, INIT_FEATURES_161)


def _torchvision_cache() -> Path | None:
    """torchvision's cached ImageNet weights, if torchvision is importable and the file is on disk."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return None
    path = Path(torch.hub.get_dir()) / "checkpoints" / TORCHVISION_FILE
    return path if path.is_file() else None


def load_pretrained(model: DenseNet, path: str | Path) -> DenseNet:
    """Load a DenseNet-121 state dict (torchvision's, old or new key names) except the classifier."""
    state = DenseNet.adapt_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    state = {k: v for k, v in state.items() if not k.startswith("classifier")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("classifier") and not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ValueError(
            f"{path}: not a DenseNet-121 state dict (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model


def densenet121_imagenet(input_shape: tuple[int, ...], num_outputs: int = 1) -> DenseNet:
    """DenseNet-121 with ImageNet weights from ``$FEDXRISK_DENSENET121_WEIGHTS`` or torchvision's
    cache (``$TORCH_HOME/hub/checkpoints``); the classifier stays random. Never downloads."""
    if input_shape[0] != 3:
        raise ValueError(f"ImageNet weights expect 3-channel images, got input shape {input_shape}")
    path = os.environ.get(WEIGHTS_ENV) or _torchvision_cache()
    if not path or not Path(path).is_file():
        raise FileNotFoundError(
            f"densenet121_imagenet needs local weights: set {WEIGHTS_ENV} to a DenseNet-121 state dict, "
            f"or place torchvision's {TORCHVISION_FILE} in {Path(torch.hub.get_dir()) / 'checkpoints'} "
            "(fedxrisk never downloads)"
        )
    return load_pretrained(densenet121(input_shape, num_outputs), path)
