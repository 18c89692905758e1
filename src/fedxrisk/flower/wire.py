"""What travels between server and sites: named tensors and scalars, never positional lists.

A :class:`Packet` is transport-neutral: ``config`` (scalars: what to do, which
round and collective call), ``metrics`` (numbers a site reports) and ``arrays``
(named groups of named tensors, e.g. ``payload`` = ``{"w/fc1.weight": ...,
"alpha": ...}``). The Flower layer maps them one to one onto a ConfigRecord, a
MetricRecord and one ArrayRecord per group; tests pass them in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fedxrisk.tree import Tree

SEP = "/"  # tree paths: parameter names contain "." but never "/"


@dataclass
class Packet:
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    arrays: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        return self.config.get("error")


def flatten(tree: Tree, prefix: str = "") -> dict[str, torch.Tensor]:
    """``{"w": {"fc.weight": t}, "a": s}`` → ``{"w/fc.weight": t, "a": s}``.

    An empty dict (a model without buffers) is kept as the path ``"buffers/"``
    with an empty tensor, so :func:`unflatten` restores it.
    """
    if not isinstance(tree, dict):
        return {prefix: tree}
    if not tree:
        return {prefix + SEP: torch.empty(0)}
    out: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        if SEP in key:
            raise ValueError(f"state key {key!r} contains {SEP!r}, which names tree paths on the wire")
        out.update(flatten(value, f"{prefix}{SEP}{key}" if prefix else key))
    return out


def unflatten(flat: dict[str, torch.Tensor]) -> Tree:
    """The inverse of :func:`flatten` (insertion order kept)."""
    if list(flat) == [""]:
        return flat[""]
    if list(flat) == [SEP]:
        return {}
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split(SEP)
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        if leaf:  # "" ends the path of an empty dict
            node[leaf] = value
    return tree


def clone_packet(packet: Packet) -> Packet:
    """A deep copy, as a real transport delivers (no tensor shared between the two sides)."""
    arrays = {g: {k: v.detach().clone() for k, v in group.items()} for g, group in packet.arrays.items()}
    return Packet(dict(packet.config), dict(packet.metrics), arrays)
