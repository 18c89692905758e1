"""``communicate`` by replay: a collective answered from the server's replies so far.

A Flower ClientApp cannot wait for the server inside ``communicate``. A
:class:`ReplayCollective` returns the k-th call's answer when the site already
has it and otherwise raises :class:`CollectiveRequest` with the payload, which
becomes the site's reply (:mod:`fedxrisk.flower.site` explains the protocol).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedxrisk.engines.simulation import LoopEngine
from fedxrisk.tree import Tree, tmap


class CollectiveRequest(Exception):
    """Raised inside ``communicate`` at a collective call whose answer the site lacks."""

    def __init__(self, kind: str, payload: Tree, call: int, key: int = 0):
        super().__init__(f"collective {kind} #{call} needs the server")
        self.kind, self.payload, self.call, self.key = kind, payload, call, key


class SiteError(RuntimeError):
    """A failure on a site (bad data, non-finite loss, protocol mismatch), reported to the server."""


class ReplayCollective:
    """``mean``/``gather`` answered from the server's replies so far; else a request.

    Leaves carry a leading axis of size 1 (this site's one client). An answer is
    the reduced tree without that axis: the mean (``[*shape]``) or the gathered
    stack of all clients (``[K, *shape]``); both get the axis back.
    """

    def __init__(self, num_clients: int, answers: list[tuple[str, Tree]]):
        self.num_clients = num_clients
        self.answers = answers
        self.calls = 0

    def _call(self, kind: str, tree: Tree, key: int = 0, answer_shape: Tree | None = None) -> Tree:
        call, self.calls = self.calls, self.calls + 1
        if call >= len(self.answers):
            raise CollectiveRequest(kind, tree, call, key)
        answer_kind, answer = self.answers[call]
        if answer_kind != kind:
            raise SiteError(
                f"collective #{call}: the server answered a {answer_kind}, communicate asked a {kind}"
            )
        try:
            return tmap(
                lambda _, a: a.unsqueeze(0).clone(), tree if answer_shape is None else answer_shape, answer
            )
        except (KeyError, TypeError) as e:
            raise SiteError(f"collective #{call}: the server's answer lacks tensor {e}") from e

    def mean(self, tree: Tree) -> Tree:
        return self._call("mean", tree)

    def gather(self, tree: Tree) -> Tree:
        return self._call("gather", tree)

    def pool(self, groups: dict[str, Tree], valid: dict[str, torch.Tensor], key: int) -> dict[str, Tree]:
        """The records and masks go up; the server's merged, shuffled pool comes down (no mask)."""
        return self._call("pool", {"groups": groups, "valid": valid}, key, answer_shape=groups)

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return LoopEngine().map_clients(fn, *trees)
