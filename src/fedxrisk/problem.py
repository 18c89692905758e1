"""The learning problem shared by all clients: a model used functionally.

Client state holds the parameters and buffers; the ``nn.Module`` is only a
template evaluated with :func:`torch.func.functional_call`, so the same code
runs per client (loop engine) and batched over clients (vmap engine).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedxrisk.errors import ConfigError
from fedxrisk.tree import Tree

BUFFER_POLICIES = ("average", "local")
POS_RATIO_MODES = ("global", "local", "batch")
PERSONAL = ("none", "bn", "head")  # model entries kept on their site (FedBN; FedPer/FedRep's head)


@dataclass
class Problem:
    """A model template plus the facts every client agrees on.

    Args:
        model: any ``nn.Module`` mapping a batch of inputs to one logit per row
            (``num_labels`` logits per row for multi-label data).
        pos_ratio: the global positive ratio p of the training data (all clients);
            one per label for multi-label data.
        buffer_policy: ``"average"`` (BatchNorm running stats are averaged with
            the model) or ``"local"`` (each client keeps its own).
        pos_ratio_mode: which p the AUC losses use: ``global`` (default),
            ``local`` (the client's own ratio) or ``batch`` (the mini-batch's).
        num_labels: L; 1 (default) is a binary task with scalar logits ``[batch]``;
            L > 1 gives logits ``[batch, L]`` and per-label AUC variables a, b, α.
        sampled_pos_ratio: r = P/B under class-aware batches (set by
            :func:`fedxrisk.classaware.class_aware_batches`); the AUC losses
            then use p = r in every mode (the derivation is in that module).
        eval_batch_size: samples per forward pass when evaluating or predicting
            (:func:`fedxrisk.metrics.predict`); None: from the default memory budget.
        personal: model entries that never leave their site (``local_names``): ``none``,
            ``bn`` (FedBN, Li et al. 2021: BatchNorm weights, biases and running statistics)
            or ``head`` (FedPer/FedRep: the classifier head); the rest is averaged as usual.
    """

    model: nn.Module
    pos_ratio: float | list[float]
    buffer_policy: str = "average"
    pos_ratio_mode: str = "global"
    num_labels: int = 1
    sampled_pos_ratio: float | None = None
    eval_batch_size: int | None = None
    personal: str = "none"

    def __post_init__(self) -> None:
        if self.personal not in PERSONAL:
            raise ValueError(f"personal must be one of {PERSONAL}, got {self.personal!r}")
        self.local_names = personal_names(self.model, self.personal)
        if self.buffer_policy not in BUFFER_POLICIES:
            raise ValueError(f"buffer_policy must be one of {BUFFER_POLICIES}, got {self.buffer_policy!r}")
        if self.pos_ratio_mode not in POS_RATIO_MODES:
            raise ValueError(f"pos_ratio_mode must be one of {POS_RATIO_MODES}, got {self.pos_ratio_mode!r}")
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be ≥ 1, got {self.num_labels}")

    @property
    def label_shape(self) -> tuple[int, ...]:
        """Shape of a per-label variable (a, b, α): ``()`` for one label, ``(L,)`` otherwise."""
        return () if self.num_labels == 1 else (self.num_labels,)

    def init_model(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Detached copies of the template's parameters and buffers."""
        params = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        buffers = {k: v.detach().clone() for k, v in self.model.named_buffers()}
        return params, buffers

    def logits(
        self, params: Tree, buffers: Tree, x: torch.Tensor, train: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Logits of shape ``[batch]`` (``[batch, L]``) and the buffers after this forward pass.

        ``train=False`` runs the template in eval mode (BatchNorm uses and keeps its running statistics).
        """
        buffers = {k: v.clone() for k, v in buffers.items()}
        if train:
            out = functional_call(self.model, (params, buffers), (x,))
        else:
            was = self.model.training
            self.model.eval()
            try:
                out = functional_call(self.model, (params, buffers), (x,))
            finally:
                self.model.train(was)
        return out.reshape(out.shape[0], *self.label_shape), buffers

    def client_pos_ratio(self, local_ratio: float | list[float]) -> float | list[float]:
        """The p a client's AUC loss starts with (``batch`` mode overrides per step)."""
        if self.sampled_pos_ratio is not None:
            return self.sampled_pos_ratio
        return local_ratio if self.pos_ratio_mode == "local" else self.pos_ratio

    def batch_p(self, p_state: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """p for this mini-batch: r = P/B under class-aware batches, else the stored p,
        or the batch's ratio (per label) in ``batch`` mode."""
        if self.sampled_pos_ratio is not None:
            return torch.full_like(p_state, self.sampled_pos_ratio)
        return y.mean(0) if self.pos_ratio_mode == "batch" else p_state


def personal_names(model: nn.Module, personal: str) -> frozenset[str]:
    """Names of the parameters and buffers that stay on their site under ``personal``."""
    if personal == "none":
        return frozenset()
    if personal == "bn":
        kinds = (nn.modules.batchnorm._NormBase,)
        prefixes = [name for name, m in model.named_modules() if isinstance(m, kinds)]
        what = "BatchNorm layer"
    else:
        head = getattr(model, "head_name", None) or next(
            (n for n, m in reversed(list(model.named_modules())) if isinstance(m, nn.Linear)), None
        )
        prefixes, what = ([] if head is None else [head]), "classifier head (head_name or an nn.Linear)"
    names = [
        n
        for n, _ in [*model.named_parameters(), *model.named_buffers()]
        if any(n.startswith(f"{p}.") for p in prefixes)
    ]
    if not names:
        raise ConfigError(f"personal = {personal!r}: the model {type(model).__name__} has no {what}")
    return frozenset(names)
