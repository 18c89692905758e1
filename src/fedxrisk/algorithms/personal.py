"""Personal model entries: what stays on its site while the rest of the model is averaged.

FedBN (Li et al., ICLR 2021, Alg. 1) averages every parameter except the BatchNorm layers'
(weights, biases and running statistics stay local); FedPer (Arivazhagan et al. 2019) and
FedRep (Collins et al., ICML 2021) keep the classifier head local. Both are one rule, applied
to any algorithm whose round is a mean of its state: an entry named in
``Problem.local_names`` (:func:`fedxrisk.problem.personal_names`) is never sent. The engines
hand ``communicate`` a :class:`SiteCollective`, whose ``mean`` returns such entries as the
site holds them, wherever they sit in the tree (the model ``w``, the buffers, FedAvg's
momentum ``m``, CODA+'s stage average, CODASCA's control variates): for those coordinates
every algorithm runs exactly as on a federation of one client. So

- FedAvg (``localsgdm``): personal parameters and their momentum are local SGD with momentum;
- CODA+ (``coda``/``codaplus``): the prox reference and the restart of a personal entry are the
  site's own stage average (the paper's algorithm with K = 1 on those coordinates);
- CODASCA: the control variate of a personal entry cancels (c_k = c), and the server step
  η_g extrapolates it from the site's own round start (η_g = 1, the default, leaves it alone).

Entries an algorithm sends with ``gather`` or ``pool`` (per-sample scores of FeDXL) are never
model entries; a personal entry reaching ``gather`` is refused (nothing silently shared).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedxrisk.tree import Tree, leaves


def split_personal(tree: Tree, names: frozenset[str]) -> Tree:
    """``tree`` without the leaves whose key is in ``names`` (emptied sub-trees dropped)."""
    out = {}
    for key, value in tree.items():
        if key in names:
            continue
        if isinstance(value, dict):
            value = split_personal(value, names)
            if not value:
                continue
        out[key] = value
    return out


def merge_personal(tree: Tree, averaged: Tree, names: frozenset[str]) -> Tree:
    """``averaged`` with the personal leaves of ``tree`` put back, in ``tree``'s key order."""
    out = {}
    for key, value in tree.items():
        if key in names:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = merge_personal(value, averaged.get(key, {}), names)
        else:
            out[key] = averaged[key]
    return out


class SiteCollective:
    """A collective that keeps ``names`` on their site: ``mean`` leaves them as they are and sends
    the rest (one packed call, as before); everything else is the wrapped collective's."""

    def __init__(self, inner: Any, names: frozenset[str]):
        self.inner, self.names = inner, names

    def __getattr__(self, attr: str) -> Any:  # num_clients, finish (distributed), ...
        return getattr(self.inner, attr)

    def mean(self, tree: Tree) -> Tree:
        shared = split_personal(tree, self.names)
        return merge_personal(tree, self.inner.mean(shared) if shared else {}, self.names)

    def gather(self, tree: Tree) -> Tree:
        personal = [p for p, _ in leaves(tree) if _named(p, self.names)]
        if personal:
            raise ValueError(
                f"personal entries may not be gathered (they stay on their site): {personal[:3]}"
            )
        return self.inner.gather(tree)

    def pool(self, groups: dict[str, Tree], valid: dict[str, Any], key: int) -> dict[str, Tree]:
        return self.inner.pool(groups, valid, key)

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return self.inner.per_client(fn, *trees)


def _named(path: str, names: frozenset[str]) -> bool:
    return any(path == n or path.endswith(f".{n}") for n in names)


def start_values(problem: Any, params: Tree, buffers: Tree) -> tuple[Tree, Tree]:
    """``(params, buffers)`` with every personal entry at the template's starting value (present
    or not): the model of a party that never receives a site's personal entries (Flower's server,
    ``flower/personal.py``); the identity when nothing is personal."""
    names = getattr(problem, "local_names", frozenset())
    if not names:
        return params, buffers
    start = problem.init_model()
    return tuple(  # type: ignore[return-value]
        {k: first if k in names else own[k] for k, first in s.items()}
        for own, s in zip((params, buffers), start, strict=True)
    )


def site_collective(comm: Any, problem: Any) -> Any:
    """``comm`` itself when nothing is personal, else wrapped in :class:`SiteCollective`."""
    names = getattr(problem, "local_names", frozenset())
    return SiteCollective(comm, names) if names else comm
