"""Arithmetic on *trees*: nested dicts whose leaves are tensors.

Client state in fedxrisk is a tree (``{"w": {...params...}, "alpha": tensor}``).
These helpers keep algorithm files close to the papers' vector notation:
``tmap(lambda v, g: v - lr * g, w, grad)`` reads as ``v - lr * g``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from fedxrisk.errors import ConfigError

Tree = Any  # a Tensor or a dict[str, Tree]


def tmap(fn: Callable[..., torch.Tensor], tree: Tree, *rest: Tree) -> Tree:
    """Apply ``fn`` leaf-wise to one or more trees of the same structure."""
    if isinstance(tree, dict):
        return {k: tmap(fn, tree[k], *(r[k] for r in rest)) for k in tree}
    return fn(tree, *rest)


def leaves(tree: Tree, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` pairs in a fixed (insertion) order."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, tree


def fitting(fresh: Tree, saved: Tree) -> Tree:
    """``saved`` (a checkpoint's state) when it holds ``fresh``'s entries; else one :class:`ConfigError`
    line naming the first extra or missing entry: the checkpoint was written by another version of
    fedxrisk, or for other settings, and would fail mid-round. Shapes are not compared: some states
    grow as a run goes (FeDXL's score pools)."""
    mine, theirs = {k for k, _ in leaves(fresh)}, {k for k, _ in leaves(saved)}
    if mine == theirs:
        return saved
    extra, missing = sorted(theirs - mine), sorted(mine - theirs)
    why = f"it holds {extra[0]}, which this run has not" if extra else f"it lacks {missing[0]}"
    raise ConfigError(
        f"the checkpoint's saved state does not fit this run: {why} (written by another version of "
        "fedxrisk, or for other settings); start a new run"
    )


def stack(trees: list[Tree]) -> Tree:
    """Stack per-client trees on a new leading client axis."""
    return tmap(lambda *xs: torch.stack(xs), trees[0], *trees[1:])


def index(tree: Tree, i: int) -> Tree:
    """Client ``i``'s slice of a stacked tree."""
    return tmap(lambda x: x[i], tree)


def broadcast(tree: Tree, n: int) -> Tree:
    """Copy one tree ``n`` times on a new leading axis (fresh memory)."""
    return tmap(lambda x: x.unsqueeze(0).repeat(n, *([1] * x.dim())).clone(), tree)


def zeros_like(tree: Tree) -> Tree:
    return tmap(torch.zeros_like, tree)


def clone(tree: Tree) -> Tree:
    return tmap(torch.clone, tree)


def numel_bytes(tree: Tree) -> int:
    """Bytes of all leaves of ``tree``."""
    return sum(t.numel() * t.element_size() for _, t in leaves(tree))


def is_finite(tree: Tree) -> bool:
    return all(bool(torch.isfinite(t).all()) for _, t in leaves(tree) if t.is_floating_point())
