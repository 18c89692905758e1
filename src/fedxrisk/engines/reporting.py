"""What the run loop asks of a simulation besides its rounds, with the in-process answers.

``run/loop.train`` drives any object with :class:`~fedxrisk.engines.simulation.Simulation`'s
rounds (``run_round``, ``global_model``, ``plans``, ``ledger``, …) and these members; it calls them
directly, never probing for them. Flower's ``Federation`` gives its own: the server's held-out
metrics, the sites and the deployment in the summary, and ``remote_sites`` (the sites' states,
personal models included, live on their nodes and report their own numbers).
"""

from __future__ import annotations

from typing import Any, ClassVar

from fedxrisk.metrics import evaluate
from fedxrisk.tree import Tree


class RunReporting:
    """The defaults of an in-process simulation (the ``Simulation`` base, with ``algorithm`` and ``data``)."""

    remote_sites: ClassVar[bool] = False  # True: per-site numbers come from personal_fields/row/summary

    algorithm: Any
    data: Any
    participation: Any = None  # data.clients_per_round's draw (engines/participation.py); None: every client

    def evaluate(self, params: Tree, buffers: Tree) -> dict[str, Any]:
        """A history row's test and per-client metrics of a model, on the run's own data."""
        return evaluate(self.algorithm.problem, params, buffers, self.data)

    def summary_extra(self) -> dict[str, Any]:
        """summary.json entries only the simulation knows (Flower: its sites and deployment); none here."""
        return {}

    def personal_fields(self) -> tuple[str, ...]:
        """history.csv's per-site columns reported by remote sites (in process: computed by run/personalize.py)."""
        return ()

    def personal_row(self) -> dict[str, float]:
        """The per-site numbers remote sites reported for the last evaluated round."""
        return {}

    def personal_summary(self) -> dict[str, Any] | None:
        """summary.json's ``personal`` block as remote sites reported it."""
        return None
