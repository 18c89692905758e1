"""Engines run algorithms unchanged: ``loop`` (reference) and ``vmap`` (batched clients)."""

from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.simulation import ENGINES, NonFiniteLoss, SimCollective, Simulation

__all__ = ["ENGINES", "ByteLedger", "NonFiniteLoss", "SimCollective", "Simulation"]
