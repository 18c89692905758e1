"""Engines run algorithms unchanged: ``loop`` (reference), ``vmap`` (batched clients)
and ``distributed`` (torch.distributed ranks)."""

from fedxrisk.engines.distributed import DistCollective, DistributedError, DistributedSimulation
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.simulation import ENGINES, NonFiniteLoss, SimCollective, Simulation

ENGINE_NAMES = (*ENGINES, "distributed")

__all__ = [
    "ENGINES", "ENGINE_NAMES", "ByteLedger", "DistCollective", "DistributedError",
    "DistributedSimulation", "NonFiniteLoss", "SimCollective", "Simulation",
]  # fmt: skip
