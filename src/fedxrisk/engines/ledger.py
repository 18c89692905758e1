"""Byte accounting of every collective: per client, per round, per named variable."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fedxrisk.tree import Tree, leaves, numel_bytes


def _per_client_bytes(tree: Tree) -> int:
    """Bytes of one client's share of a stacked tree (leading axis = clients)."""
    return sum(t[0].numel() * t.element_size() if t.dim() else t.element_size() for _, t in leaves(tree))


class ByteLedger:
    """Counts bytes sent up (client → server) and down (server → client) by each client.

    ``mean`` of a variable costs its size up and the same size down; ``gather``
    costs its size up and ``num_clients`` times its size down (everyone receives
    everyone's values); ``pool`` costs its records and their validity mask up and
    the merged pool (valid entries of all clients) down. Totals are per variable
    (top-level key) and per round; ``kinds`` names the collective each variable used.
    """

    def __init__(self) -> None:
        self.up: dict[str, int] = defaultdict(int)
        self.down: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.rounds: list[tuple[int, int]] = []
        self.kinds: dict[str, str] = {}
        self._round_up = self._round_down = 0

    def _add(self, kind: str, name: str, up: int, down: int) -> None:
        self.kinds[name] = kind
        self.up[name] += up
        self.down[name] += down
        self._round_up += up
        self._round_down += down

    def record(self, kind: str, tree: dict[str, Any], num_clients: int) -> None:
        self.calls[kind] += 1
        for name, sub in tree.items():
            size = _per_client_bytes(sub)
            self._add(kind, name, size, size * (num_clients if kind == "gather" else 1))

    def record_pool(self, groups: dict[str, Any], valid: dict[str, Any], merged: dict[str, Any]) -> None:
        """``groups``/``valid``: stacked records and masks sent (per client: ``[0]``); ``merged``:
        the unstacked pool every client receives."""
        self.calls["pool"] += 1
        for name, sub in groups.items():
            received = numel_bytes(merged[name])
            self._add("pool", name, _per_client_bytes(sub) + _per_client_bytes(valid[name]), received)

    def close_round(self) -> None:
        self.rounds.append((self._round_up, self._round_down))
        self._round_up = self._round_down = 0

    @property
    def total_up(self) -> int:
        return sum(self.up.values())

    @property
    def total_down(self) -> int:
        return sum(self.down.values())

    def summary(self) -> dict[str, Any]:
        n = max(len(self.rounds), 1)
        return {
            "rounds": len(self.rounds),
            "bytes_up_per_client": self.total_up,
            "bytes_down_per_client": self.total_down,
            "bytes_up_per_client_per_round": self.total_up / n,
            "bytes_down_per_client_per_round": self.total_down / n,
            "by_variable": {k: {"up": self.up[k], "down": self.down[k]} for k in sorted(self.up)},
            "collective_calls": dict(self.calls),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "up": dict(self.up),
            "down": dict(self.down),
            "calls": dict(self.calls),
            "rounds": list(self.rounds),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.up = defaultdict(int, state["up"])
        self.down = defaultdict(int, state["down"])
        self.calls = defaultdict(int, state["calls"])
        self.rounds = [tuple(r) for r in state["rounds"]]
