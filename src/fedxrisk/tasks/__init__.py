"""Data sources for conditional stochastic tasks (FCSG paper §5).

Each source is duck-typed for :class:`~fedxrisk.engines.Simulation`: it has
``num_clients``, ``shard_sizes``, ``client_pos_ratio(k)`` and
``batch(positions, device)``, which returns a stacked conditional sample
(``xi``/``eta`` trees with a leading client axis). Sources that draw fresh
data (invariant logistic regression, few-shot tasks) use one NumPy generator
per client seeded by ``(seed, k)`` and ignore ``positions`` beyond their shape,
so the loop and vmap engines see identical samples.
"""

from fedxrisk.tasks.auprc import AUPRCData, table2_federated
from fedxrisk.tasks.fewshot import FewShotTasks, digits_fewshot, evaluate_fewshot, load_omniglot
from fedxrisk.tasks.invariant import InvariantLRData, invariant_accuracy

__all__ = [
    "AUPRCData",
    "FewShotTasks",
    "InvariantLRData",
    "digits_fewshot",
    "evaluate_fewshot",
    "invariant_accuracy",
    "load_omniglot",
    "table2_federated",
]
