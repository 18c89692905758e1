"""Forward FLOPs of one training sample of a simulation's model: ``auto``'s engine rule reads them."""

from __future__ import annotations

from typing import Any

import torch


def forward_flops_per_sample(sim: Any) -> tuple[int, bool]:
    """(forward FLOPs of one training sample, whether the model has convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode

    problem = getattr(sim.algorithm, "problem", None)
    if problem is None:
        return 0, False
    params, buffers = problem.init_model()
    x = sim.data.data.x_train[:2].to(sim.device)  # two samples: BatchNorm needs more than one
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        problem.logits(params, buffers, x)
    conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in problem.model.modules())
    return counter.get_total_flops() // len(x), conv
