"""Flower's SecAgg+ around fedxrisk's step exchanges (``secure-aggregation = true``; needs ``flwr``).

Route: Flower's own ``SecAggPlusWorkflow`` (server) and ``secaggplus_mod`` (ClientApp), one
workflow run per step exchange. The workflow speaks the legacy strategy API, so a one-exchange
strategy carries our step packets: its ``configure_fit`` puts each site's request into the
``FitIns`` config (bytes), its ``aggregate_fit`` receives the unmasked aggregate. On the site,
the mod runs our handler in its "collect masked vectors" stage: the handler runs the site's
step and returns the ``mean`` payload as the ``FitRes`` parameters (one float64 vector, weight
``num_examples = 1`` on every site with ``max_weight = 1``, so the aggregate is the plain mean)
and the rest of its reply (flags, metrics, the evaluated global model) as bytes in the
``FitRes`` metrics, which the mod leaves unmasked. The server therefore holds, per exchange,
each site's masked vector and the aggregate, never a site's own payload.

Each exchange costs SecAgg+'s four message rounds (set-up, share keys, collect, unmask): the
masks must be fresh for every vector. Shares: every site holds one of every other site's
secrets (``num_shares`` = all), and all K are needed to reconstruct one (threshold = K);
fedxrisk stops the run when a site is lost anyway, so no drop-out needs recovering.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.serverapp import Grid

from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.private import share_cap
from fedxrisk.flower.secure import (
    MODULUS,
    VALIDATION,
    VALIDATION_NOISY,
    check_range,
    flat_vector,
    levels,
    packet_bytes,
    packet_from_bytes,
    split_vector,
    summed_counts,
    summed_shares,
    value_range,
)
from fedxrisk.flower.wire import Packet

KEY = "fedxrisk"  # the FitIns config / FitRes metrics entry holding our packet (bytes)


# -- ClientApp side (wrapped by secaggplus_mod) ------------------------------------------------
def secure_step_handler(
    run_step: Callable[[Context, Packet], Packet],
) -> Callable[[Message, Context], Message]:
    """The ClientApp ``train`` function under SecAgg+: ``run_step(context, request)`` is the plain
    step; its ``payload`` becomes the vector the mod masks, the rest travels as bytes."""

    def handler(msg: Message, context: Context) -> Message:
        request = packet_from_bytes(compat.recorddict_to_fitins(msg.content, keep_input=True).config[KEY])
        reply = run_step(context, request)
        payload = reply.arrays.pop("payload", {}) | reply.arrays.pop("secure", {})  # the validation histogram
        if not reply.error:
            bound = value_range(FlowerConfig.from_run_config(context.run_config))
            if (problem := check_range(payload, bound)) is not None:
                reply, payload = Packet(config={"error": problem}), {}
        vector, layout = flat_vector(payload)
        reply.config["layout"] = json.dumps(layout)
        fitres = FitRes(
            Status(Code.OK, ""), ndarrays_to_parameters([vector.numpy()]), 1, {KEY: packet_bytes(reply)}
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)

    return handler


# -- ServerApp side ------------------------------------------------------------------------------
class _OneExchange(Strategy):
    """configure_fit: our request per node; aggregate_fit: keep the aggregate and the replies."""

    def __init__(self, requests: dict[int, Packet], proxies: dict[int, GridClientProxy]):
        self.requests, self.proxies = requests, proxies
        self.results: dict[int, FitRes] = {}

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> list:
        empty = Parameters(tensors=[], tensor_type="numpy.ndarray")
        return [(self.proxies[n], FitIns(empty, {KEY: packet_bytes(p)})) for n, p in self.requests.items()]

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple[Any, dict]:
        self.results = {proxy.node_id: res for proxy, res in results}
        return (results[0][1].parameters if results else None), {}

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple[None, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


class WatchedGrid(Grid):
    """The Grid the workflow talks through: polls replies every ``poll`` seconds (flwr's own waits 3 s),
    stops waiting for a node that left, and keeps every reply the server received (``received``)."""

    def __init__(self, grid: Grid, poll: float = 0.1):
        self.inner, self.poll = grid, poll
        self.received: list[Message] = []

    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None) -> Message:  # fmt: skip
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.inner.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.inner.pull_messages(message_ids))
        self.received += replies
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        waiting = dict(zip(self.push_messages(messages), (m.metadata.dst_node_id for m in messages)))
        end, check, out = time.monotonic() + (timeout or float("inf")), time.monotonic() + 1.0, []
        while waiting and time.monotonic() < end:
            for reply in self.pull_messages(list(waiting)):
                waiting.pop(reply.metadata.reply_to_message_id, None)
                out.append(reply)
            if waiting and time.monotonic() >= check:  # a node that left will not answer
                if set(waiting.values()) - set(self.get_node_ids()):
                    break
                check = time.monotonic() + 1.0
            if waiting:
                time.sleep(self.poll)
        return out

    def reason(self, node: int, failure: str | None, describe: Callable[[Message], str]) -> str:
        """Why ``node`` has no aggregate: its own error, Flower's error, departure, or the halt."""
        for reply in reversed(self.received):
            if reply.metadata.src_node_id != node:
                continue
            if reply.has_error():
                return describe(reply)
            if "fitres.metrics" in reply.content:
                error = packet_from_bytes(compat.recorddict_to_fitres(reply.content, True).metrics[KEY]).error
                if error:
                    return error
        if node not in set(self.get_node_ids()):
            return "left the federation: its SuperNode shut down or stopped sending heartbeats"
        return f"secure aggregation halted ({failure or 'a site did not answer a SecAgg+ stage in time'})"


def secure_exchange(
    grid: Grid,
    requests: dict[int, Packet],
    cfg: FlowerConfig,
    exchange: int,
    describe: Callable[[Message], str],
) -> tuple[dict[int, Packet], WatchedGrid]:
    """One step exchange through SecAgg+: each site's reply without its payload, plus
    ``arrays["mean"]``, the sites' mean (or ``config["error"]``); and the grid that carried it."""
    watched = WatchedGrid(grid)
    run_id = grid.run.run_id
    strategy = _OneExchange(requests, {n: GridClientProxy(n, watched, run_id) for n in requests})
    state = RecordDict({"config": ConfigRecord({"current_round": exchange}), "parameters": ArrayRecord()})
    context = LegacyContext(Context(run_id, 0, {}, state, {}), strategy=strategy)
    workflow = SecAggPlusWorkflow(
        1.0, 1.0, max_weight=1.0, clipping_range=float(value_range(cfg)),
        quantization_range=levels(len(requests)), modulus_range=MODULUS, timeout=cfg.deploy.round_timeout,
    )  # fmt: skip
    failure = None
    try:
        workflow(watched, context)
    except Exception as e:  # e.g. sites sent vectors of different lengths (one failed)
        failure = f"{type(e).__name__}: {e}"
    out = {}
    for node in requests:
        res = strategy.results.get(node)
        if res is None:
            out[node] = Packet(config={"error": watched.reason(node, failure, describe)})
            continue
        packet = packet_from_bytes(res.metrics[KEY])
        layout = json.loads(packet.config.pop("layout"))
        if not packet.error:
            (vector,) = parameters_to_ndarrays(res.parameters)
            mean = split_vector(torch.from_numpy(vector), layout)
            if VALIDATION in mean:  # the sites' summed validation histogram, exact integers
                counts = summed_counts(mean.pop(VALIDATION), cfg, len(requests))
                packet.arrays["validation-sum"] = {"counts": counts}
            if VALIDATION_NOISY in mean:  # DP: the sum of the sites' noised shares, never exact
                vector = mean.pop(VALIDATION_NOISY)
                cap = share_cap(cfg, vector.numel(), len(requests))
                noisy = summed_shares(vector, cfg, len(requests), cap)
                packet.arrays["validation-noisy"] = {"counts": noisy}
            packet.arrays["mean"] = mean
        out[node] = packet
    return out, watched
