"""The Flower ServerApp and ClientApp (needs ``fedxrisk[flower]``).

- The ServerApp's ``main`` runs :class:`~fedxrisk.flower.coordinator.Coordinator`
  (``fedxrisk run``'s loop, ``run/loop.train``, over the sites) through a
  :class:`GridTransport`: each exchange is one Message per SuperNode, pushed on
  the Grid and polled for replies.
- The ClientApp answers ``query`` (set-up: load and check the site's data) and
  ``train.step`` (deliver a collective's answer, run communicate/local steps, reply
  with the next collective's payload and the round's metrics). The site's
  state lives in ``context.state`` under ``site.*`` and never leaves the node.
- With ``secure-aggregation = true`` every step exchange is one run of Flower's
  SecAgg+ workflow instead (``train`` messages, :mod:`fedxrisk.flower.secagg`).

A :class:`~fedxrisk.flower.wire.Packet` maps onto a RecordDict as
``config`` → ConfigRecord, ``metrics`` → MetricRecord and each array group
``g`` → ArrayRecord ``arrays.g`` with one named Array per tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from fedxrisk.flower import require_flwr

require_flwr()

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.client.mod import secaggplus_mod  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.flower.coordinator import Coordinator  # noqa: E402
from fedxrisk.flower.evaluate import OP as EVALUATE  # noqa: E402
from fedxrisk.flower.evaluate import site_evaluate  # noqa: E402
from fedxrisk.flower.handlers import SiteLoader, site_setup, site_step  # noqa: E402
from fedxrisk.flower.secagg import secure_exchange, secure_step_handler  # noqa: E402
from fedxrisk.flower.sitedata import SiteData, load_site  # noqa: E402
from fedxrisk.flower.wire import Packet  # noqa: E402

ARRAYS = "arrays."
SITE = "site."  # prefix of the site's saved state in context.state
OPS = {"setup": "query", "step": "train.step"}
logger = logging.getLogger("fedxrisk.flower")


def to_records(packet: Packet, prefix: str = "") -> RecordDict:
    records: dict[str, Any] = {f"{prefix}config": ConfigRecord(dict(packet.config))}
    if packet.metrics:
        records[f"{prefix}metrics"] = MetricRecord(dict(packet.metrics))
    for group, arrays in packet.arrays.items():
        named = {name: Array(t.detach().cpu().contiguous()) for name, t in arrays.items()}
        records[f"{prefix}{ARRAYS}{group}"] = ArrayRecord(named)
    return RecordDict(records)


def from_records(records: RecordDict, prefix: str = "") -> Packet:
    packet = Packet(config=dict(records[f"{prefix}config"]))
    if f"{prefix}metrics" in records:
        packet.metrics = dict(records[f"{prefix}metrics"])
    for key in records:
        if key.startswith(f"{prefix}{ARRAYS}"):
            group = key[len(prefix) + len(ARRAYS) :]
            packet.arrays[group] = {n: torch.from_numpy(a.numpy().copy()) for n, a in records[key].items()}
    return packet


# -- ClientApp -----------------------------------------------------------------------

SiteSource = Callable[[Context, FlowerConfig], SiteData]  # the site's data, from its context


def _from_node_config(context: Context, cfg: FlowerConfig) -> SiteData:
    return load_site(context.node_config, cfg)


def build_client_app(
    load: SiteSource = _from_node_config, view: Callable[[Context], Context] = lambda context: context
) -> ClientApp:
    """The site's ClientApp. ``load``: where a site's data comes from (default: its node config);
    ``view``: the context the handlers see (:mod:`fedxrisk.flower.api` fills in its run config)."""
    app = ClientApp()

    def loader(context: Context) -> SiteLoader:
        return lambda node_config, cfg: load(context, cfg)

    @app.query()
    def setup(msg: Message, context: Context) -> Message:
        """Load and check this site's data; report its size and class counts."""
        context = view(context)
        reply = site_setup(context.node_config, context.run_config, load=loader(context))
        return Message(to_records(reply), reply_to=msg)

    def run_step(context: Context, request: Packet) -> Packet:
        """The site's step on ``request``, its state kept in ``context.state`` (never sent)."""
        if request.config.get("op") == EVALUATE:  # a federated evaluation's exchange (flower/evaluate.py)
            return site_evaluate(context.node_config, context.run_config, request)
        saved = from_records(context.state, SITE) if f"{SITE}config" in context.state else None
        reply, new = site_step(context.node_config, context.run_config, saved, request, load=loader(context))
        if new is not None and new is not saved:
            for key in [k for k in context.state if k.startswith(SITE)]:
                del context.state[key]
            for key, record in to_records(new, SITE).items():
                context.state[key] = record
        return reply

    @app.train("step")
    def step(msg: Message, context: Context) -> Message:
        """One protocol step on this site's data (message type ``train.step``)."""
        return Message(to_records(run_step(view(context), from_records(msg.content))), reply_to=msg)

    @app.query(EVALUATE)
    def evaluate(msg: Message, context: Context) -> Message:
        """A federated evaluation's exchange without secure aggregation (message type ``query.evaluate``)."""
        context = view(context)
        reply = site_evaluate(context.node_config, context.run_config, from_records(msg.content))
        return Message(to_records(reply), reply_to=msg)

    # ``train`` messages are SecAgg+'s (secure-aggregation = true): the mod runs the key exchange and
    # masks the mean payload the handler returns (flower/secagg.py)
    secure = secure_step_handler(run_step)

    @app.train(mods=[secaggplus_mod])
    def secure_step(msg: Message, context: Context) -> Message:
        return secure(msg, view(context))

    return app


client_app = build_client_app()


# -- ServerApp -----------------------------------------------------------------------


class GridTransport:
    """The coordinator's transport over Flower's Grid: push Messages, poll their replies."""

    def __init__(self, grid: Grid, cfg: FlowerConfig | None = None):
        self.grid, self.cfg = grid, cfg
        self.exchanges = 0  # secure exchanges so far (SecAgg+'s group id)

    def node_ids(self) -> set[int]:
        return set(self.grid.get_node_ids())

    def send(self, requests: dict[int, Packet], op: str) -> Any:
        if op == "secure-step":  # the whole SecAgg+ workflow runs here; poll hands out its replies
            self.exchanges += 1
            replies, _ = secure_exchange(self.grid, requests, self.cfg, self.exchanges, _flower_error)
            return _Done(replies)
        messages = [
            Message(to_records(packet), dst_node_id=node, message_type=OPS[op])
            for node, packet in requests.items()
        ]
        ids = list(self.grid.push_messages(messages))
        return dict(zip(ids, requests))  # message id → node

    def poll(self, handle: Any) -> dict[int, Packet]:
        if isinstance(handle, _Done):
            out, handle.replies = handle.replies, {}
            return out
        if not handle:
            return {}
        out = {}
        for reply in self.grid.pull_messages(list(handle)):
            node = handle.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            if reply.has_error():
                out[node] = Packet(config={"error": _flower_error(reply)})
            else:
                out[node] = from_records(reply.content)
        return out


class _Done:
    def __init__(self, replies: dict[int, Packet]):
        self.replies = replies


def _flower_error(reply: Message) -> str:
    code, reason = reply.error.code, reply.error.reason
    if code == ErrorCode.NODE_UNAVAILABLE:  # the SuperLink's verdict on a node that shut down or went silent
        return (
            f"left the federation: its SuperNode shut down or stopped sending heartbeats (Flower: {reason})"
        )
    return f"Flower error {code}: {reason}"


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured algorithm over the connected SuperNodes (outputs in ``out-dir``)."""
    from flwr.common.logger import log

    cfg = FlowerConfig.from_run_config(context.run_config)
    Coordinator(
        cfg, GridTransport(grid, cfg), log=lambda text: log(logging.INFO, "[fedxrisk] %s", text)
    ).run()
