"""Talking to sites: the transport interface, the sites' identities, and the node-loss policy.

The server knows sites only through a :class:`Transport` (send a packet to some
nodes, poll for their replies, list the connected nodes). Flower's Grid is one
transport (:mod:`fedxrisk.flower.app`); :class:`LocalTransport` runs the same site
handlers in this process, for tests and for checking a configuration before
deploying it. :class:`Exchange` sends and waits under the policy ``fail``: every
exchange waits at most ``round-timeout`` seconds and checks once a second that the
nodes it waits for are still connected; a site that errs, leaves, or does not
answer in time raises a :class:`FederationError` naming the site, its node and the round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fedxrisk.errors import RunFailure
from fedxrisk.flower.handlers import site_setup, site_step
from fedxrisk.flower.wire import Packet, clone_packet


class FederationError(RunFailure):
    """The run cannot go on: a site failed, left, or did not answer in time (the model of the last
    evaluated round stays sound: it is written)."""

    keeps_model = True


class Transport(Protocol):
    def node_ids(self) -> set[int]:
        """Nodes connected now."""

    def send(self, requests: dict[int, Packet], op: str) -> Any:
        """Send one packet per node (``op``: ``setup`` or ``step``); return a handle for :meth:`poll`."""

    def poll(self, handle: Any) -> dict[int, Packet]:
        """Replies that arrived since the last poll (a failed site's reply has ``config["error"]``)."""


@dataclass
class Site:
    node: int
    order: int | None
    samples: int
    positives: int
    input_shape: tuple[int, ...]
    client: int = -1

    @property
    def name(self) -> str:
        order = f", partition-id {self.order}" if self.order is not None else ""
        return f"site {self.client} (node {self.node}{order})"


class Exchange:
    """Send packets and wait for every reply, with the node-loss policy ``fail``."""

    def __init__(
        self,
        transport: Transport,
        round_timeout: float,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.transport, self.round_timeout = transport, round_timeout
        self.poll_interval, self.clock, self.sleep = poll_interval, clock, sleep
        self.by_node: dict[int, Site] = {}  # filled once the sites are known (names in messages)

    def name(self, node: int) -> str:
        return self.by_node[node].name if node in self.by_node else f"node {node}"

    def wait_for_nodes(self, min_nodes: int, timeout: float) -> list[int]:
        """The connected nodes once there are ``min_nodes``; FederationError after ``timeout`` s."""
        deadline = self.clock() + timeout
        while len(nodes := self.transport.node_ids()) < min_nodes:
            if self.clock() >= deadline:
                raise FederationError(
                    f"only {len(nodes)} SuperNode(s) connected within node-wait-timeout = "
                    f"{timeout:g} s; min-nodes = {min_nodes}"
                )
            self.sleep(0.5)
        return sorted(nodes)

    def __call__(self, requests: dict[int, Packet], op: str, what: str) -> dict[int, Packet]:
        """Send and wait for every reply; any site error, departure or timeout fails the run."""
        handle = self.transport.send(requests, op)
        waiting, replies = set(requests), {}
        deadline, next_check = self.clock() + self.round_timeout, self.clock()
        while True:
            for node, reply in self.transport.poll(handle).items():
                if node in waiting:
                    replies[node] = reply
                    waiting.discard(node)
            if not waiting:
                break
            now = self.clock()
            if now >= next_check:
                gone = waiting - self.transport.node_ids()
                if gone:
                    raise FederationError(
                        f"{what}: {', '.join(self.name(n) for n in sorted(gone))} left the federation "
                        "(its SuperNode shut down or stopped sending heartbeats); policy: the run stops"
                    )
                next_check = now + 1.0
            if now >= deadline:
                raise FederationError(
                    f"{what}: no reply from {', '.join(self.name(n) for n in sorted(waiting))} within "
                    f"round-timeout = {self.round_timeout:g} s; policy: the run stops"
                )
            self.sleep(self.poll_interval)
        errors = [f"{self.name(n)} failed: {r.error}" for n, r in sorted(replies.items()) if r.error]
        if errors:
            raise FederationError(f"{what}: " + "; ".join(errors))
        return replies


class LocalTransport:
    """Sites in this process: the same handlers a Flower ClientApp runs, with packets deep-copied
    both ways and each site's saved state kept between messages, as a node's context is."""

    def __init__(
        self,
        run_config: dict[str, Any],
        node_configs: dict[int, dict[str, Any]],
        model_fn: Any = None,
        data_fn: Any = None,
    ):
        self.run_config, self.node_configs = run_config, node_configs
        self.model_fn, self.data_fn = model_fn, data_fn  # site_setup / site_step's hooks
        self.saved: dict[int, Packet | None] = dict.fromkeys(node_configs)
        self.messages = 0

    def node_ids(self) -> set[int]:
        return set(self.node_configs)

    def answer(self, node: int, request: Packet, op: str) -> Packet | None:
        """One site's reply (``None``: no reply, e.g. a site that vanished)."""
        config = self.node_configs[node]
        if op == "setup":
            return site_setup(config, self.run_config, self.model_fn, self.data_fn)
        saved = self.saved[node]
        reply, saved = site_step(config, self.run_config, saved, request, self.model_fn, self.data_fn)
        self.saved[node] = clone_packet(saved) if saved is not None else None
        return reply

    def send(self, requests: dict[int, Packet], op: str) -> dict[int, Packet]:
        replies = {}
        for node, request in requests.items():
            self.messages += 1
            reply = self.answer(node, clone_packet(request), op)
            if reply is not None:
                replies[node] = clone_packet(reply)
        return replies

    def poll(self, handle: dict[int, Packet]) -> dict[int, Packet]:
        out = dict(handle)
        handle.clear()
        return out
