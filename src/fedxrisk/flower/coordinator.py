"""The server's round loop: set-up, collectives as server-side reductions, evaluation, policy.

The :class:`Coordinator` knows sites only through a :class:`Transport` (send a
packet to some nodes, poll for their replies, list the connected nodes).
Flower's Grid is one transport (:mod:`fedxrisk.flower.app`); :class:`LocalTransport`
runs the same site handlers in this process, for tests and for checking a
configuration before deploying it.

Node loss policy (``fail``): every exchange waits at most ``round-timeout``
seconds, and checks once a second that the nodes it waits for are still
connected. A site that errs, leaves, or does not answer in time stops the
run with a :class:`FederationError` naming the site, its node and the round;
``summary.json`` records it, ``history.csv`` and ``model.pt`` keep the last
evaluated round. The run is not continued without the site, because the
algorithms' per-client state (control variates, score pools) and their
collective shapes (a gather is ``[K, ...]``) assume a fixed set of clients.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.pooling import merge_pool
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.private import ServerDP, server_dp
from fedxrisk.flower.secure import check_secure_algorithm, secure_mean
from fedxrisk.flower.site import BEGIN, site_setup, site_step
from fedxrisk.flower.sitedata import load_holdout
from fedxrisk.flower.wire import Packet, clone_packet, flatten, unflatten
from fedxrisk.metrics import auroc, average_precision, predict
from fedxrisk.problem import Problem
from fedxrisk.run.folder import HISTORY_FIELDS, json_safe, write_json_atomic
from fedxrisk.tree import Tree, stack, tmap

FIELDS = (*HISTORY_FIELDS, "client_val_auroc_mean")


class FederationError(RuntimeError):
    """The run cannot go on: a site failed, left, or did not answer in time."""


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


class Coordinator:
    """Runs one fedxrisk algorithm over the sites a transport reaches."""

    def __init__(
        self,
        cfg: FlowerConfig,
        transport: Transport,
        log: Callable[[str], None] | None = None,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.cfg, self.transport = cfg, transport
        self.log = log or (lambda msg: None)
        self.poll_interval, self.clock, self.sleep = poll_interval, clock, sleep
        self.out = Path(cfg.out_dir)
        self.plans = list(cfg.schedule().plan())
        self.ledger = ByteLedger()
        # seed of the score-pool shuffle: a server-only secret if FEDXRISK_POOL_SEED is set on the
        # server's host (sites cannot undo the shuffle); else the run seed, which the sites also know
        # (then Flower runs equal the simulation's; docs/privacy.md)
        self.pool_seed = int(os.environ.get("FEDXRISK_POOL_SEED", cfg.seed))
        self.sites: list[Site] = []
        self.by_node: dict[int, Site] = {}
        self.history: list[dict[str, Any]] = []
        self.done = -1
        self.model: dict[str, Tree] | None = None
        self.dp: ServerDP | None = None  # client-level DP: the server clips and adds the noise

    # -- the run -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train; write ``history.csv``, ``model.pt`` and ``summary.json`` to ``out-dir``."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.start = self.clock()
        error: Exception | None = None
        with open(self.out / "history.csv", "w", newline="") as f:
            self.writer = csv.DictWriter(f, fieldnames=FIELDS)
            self.writer.writeheader()
            self.history_file = f
            try:
                self._setup()
                self._rounds()
            except Exception as e:  # recorded in summary.json, then re-raised
                error = e
        summary = self._summary(error)
        write_json_atomic(self.out / "summary.json", summary)
        if error is not None:
            self.log(f"run failed: {error}")
            raise error
        self.log(f"run completed: {json.dumps(summary['final'])}")
        return summary

    def _setup(self) -> None:
        check_secure_algorithm(self.cfg)  # before any message: SecAgg+ carries means only
        nodes = self._wait_for_nodes()
        replies = self._exchange({n: Packet(config={"op": "setup"}) for n in nodes}, "setup", "set-up")
        sites = []
        for node, reply in replies.items():
            shape = tuple(json.loads(reply.config["input-shape"]))
            order = reply.config.get("order")
            sites.append(
                Site(
                    node, order, int(reply.metrics["num-samples"]), int(reply.metrics["num-positives"]), shape
                )
            )
        orders = [s.order for s in sites if s.order is not None]
        if len(set(orders)) != len(orders):
            raise FederationError(f"two sites report the same partition-id: {sorted(orders)}")
        sites.sort(key=lambda s: (s.order is None, s.order if s.order is not None else 0, s.node))
        shapes = {s.input_shape for s in sites}
        if len(shapes) > 1:
            detail = ", ".join(f"node {s.node}: {s.input_shape}" for s in sites)
            raise FederationError(f"sites hold inputs of different shapes ({detail})")
        for k, s in enumerate(sites):
            s.client = k
        self.sites, self.by_node = sites, {s.node: s for s in sites}
        self.pos_ratio = sum(s.positives for s in sites) / sum(s.samples for s in sites)
        self.max_samples = max(s.samples for s in sites)  # ClientInfo.max_samples, as in simulation
        model = self.cfg.build_model(sites[0].input_shape)
        self.problem = Problem(model, self.pos_ratio, self.cfg.buffer_policy, self.cfg.pos_ratio_mode)
        try:  # the schedule checks engines make (CoDA's stages, LocalSCGDAM's rates)
            self.cfg.build_algorithm(self.problem).validate_schedule(self.cfg.schedule())
        except ValueError as e:
            raise FederationError(f"{self.cfg.algorithm}: {e}") from e
        self.holdout = load_holdout(self.cfg.test_data, self.cfg)
        self.dp = server_dp(self.cfg, self.problem, sites, self.max_samples, self.log)
        self.log(
            f"{len(sites)} sites, {sum(s.samples for s in sites)} samples, positive ratio "
            f"{self.pos_ratio:.4f}; {self.cfg.algorithm} for {self.cfg.rounds} rounds"
        )

    def _rounds(self) -> None:
        init = {"num-clients": len(self.sites), "pos-ratio": self.pos_ratio, "max-samples": self.max_samples}
        requests = {
            s.node: Packet(
                config={**init, "client": s.client, "start": 0, "report": self.cfg.is_eval_round(0)}
            )
            for s in self.sites
        }
        last = len(self.plans) - 1
        while True:
            what = f"round {self.done + 2}/{len(self.plans)}"  # 1-based, as in history.csv
            replies = self._exchange(requests, "secure-step" if self.cfg.secure_aggregation else "step", what)
            finished, pending = (
                self._common(replies, "finished", what),
                self._common(replies, "pending", what),
            )
            if finished >= 0:
                self._finish_round(finished, replies)
            if pending < 0:
                if self.done >= last:
                    return
                start = self.done + 1  # a round without collectives: start the next one
                config = {"start": start, "report": self.cfg.is_eval_round(start)}
                requests = {s.node: Packet(config=dict(config)) for s in self.sites}
                continue
            answer, kind, call = self._reduce(replies, pending)
            if self._common(replies, "phase", what) == BEGIN:  # the begin hook: then round 0 starts
                nxt = pending
            else:
                nxt = pending + 1 if pending < last else -1
            config = {"call": call, "kind": kind, "start": nxt, "report": self.cfg.is_eval_round(pending)}
            requests = {s.node: Packet(config=dict(config), arrays={"answer": answer}) for s in self.sites}

    # -- collectives ----------------------------------------------------------------
    def _reduce(self, replies: dict[int, Packet], round_: int) -> tuple[dict[str, torch.Tensor], str, int]:
        """The server side of ``comm.mean`` (mean over sites), ``comm.gather`` (stack of sites) and
        ``comm.pool`` (valid records of all sites, shuffled: :func:`~fedxrisk.engines.pooling.merge_pool`)."""
        what = f"round {round_ + 1}/{len(self.plans)}"
        kind, call = self._common(replies, "kind", what), self._common(replies, "call", what)
        if self.cfg.secure_aggregation:  # SecAgg+: the sites' mean arrives, never a site's payload
            return secure_mean(self, replies, round_, what), kind, call
        payloads = [replies[s.node].arrays["payload"] for s in self.sites]
        names = [list(p) for p in payloads]
        for s, keys in zip(self.sites, names):
            if keys != names[0]:
                raise FederationError(
                    f"{what}: {s.name} sent tensors {keys}, {self.sites[0].name} sent {names[0]}"
                )
        stacked = stack([unflatten(p) for p in payloads])  # leading axis: clients, as in simulation
        if kind == "pool":  # valid records of all sites, shuffled here; the masks stay on the server
            key = self._common(replies, "key", what)
            reduced = merge_pool(stacked["groups"], stacked["valid"], self.pool_seed, key)
            self.ledger.record_pool(stacked["groups"], stacked["valid"], reduced)
            return flatten(reduced), kind, call
        self.ledger.record(kind, stacked if isinstance(stacked, dict) else {"": stacked}, len(self.sites))
        if kind == "mean":
            reduced = tmap(lambda x: x.mean(0), stacked) if self.dp is None else self.dp.mean(stacked, round_)
        elif kind == "gather":  # every site receives all sites' tensors, in client order
            reduced = stacked
        else:
            raise FederationError(f"{what}: unknown collective {kind!r}")
        return flatten(reduced), kind, call

    def _common(self, replies: dict[int, Packet], key: str, what: str) -> Any:
        values = {s.name: replies[s.node].config.get(key) for s in self.sites}
        if len(set(values.values())) != 1:
            raise FederationError(f"{what}: sites disagree on {key!r} ({values}); the algorithm is not SPMD")
        return next(iter(values.values()))

    # -- evaluation and outputs -------------------------------------------------------
    def _finish_round(self, r: int, replies: dict[int, Packet]) -> None:
        self.ledger.close_round()
        self.done = r
        if not self.cfg.is_eval_round(r):
            return
        ordered = [replies[s.node] for s in self.sites]
        models = [unflatten(rep.arrays["model"]) for rep in ordered]
        params = models[0]["params"]
        buffers = {
            k: torch.stack([m["buffers"][k].float() for m in models]).mean(0).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in models[0].get("buffers", {}).items()
        }  # the simulation's global model: client 0's parameters, the client mean of float buffers
        self.model = {"params": params, "buffers": buffers}
        torch.save(
            {**self.model, "model": self.cfg.model, "input_shape": self.sites[0].input_shape},
            self.out / "model.pt",
        )
        plan = self.plans[r]
        row = {
            "round": r + 1, "step": plan.first_step + plan.window, "stage": plan.stage, "lr": plan.lr,
            "train_loss": float(torch.tensor([rep.metrics["loss"] for rep in ordered]).mean()),
            "test_auroc": math.nan, "test_ap": math.nan,
            **_mean_std([rep.metrics.get("train-auroc", -1.0) for rep in ordered], "client_auroc"),
            "client_val_auroc_mean": _mean_std([rep.metrics.get("val-auroc", -1.0) for rep in ordered], "v")["v_mean"],
            "bytes_up_per_client": self.ledger.total_up, "bytes_down_per_client": self.ledger.total_down,
            "wall_seconds": round(self.clock() - self.start, 4),
        }  # fmt: skip
        if self.holdout is not None:
            scores = predict(self.problem, params, buffers, self.holdout[0])
            y = self.holdout[1].numpy()
            row.update(test_auroc=auroc(y, scores), test_ap=average_precision(y, scores))
        self.history.append(row)
        self.writer.writerow(row)
        self.history_file.flush()
        self.log(
            f"round {r + 1}/{len(self.plans)}: train loss {row['train_loss']:.4f}, test AUROC "
            f"{row['test_auroc']:.4f}, site AUROC {row['client_auroc_mean']:.4f}"
        )

    def _summary(self, error: Exception | None) -> dict[str, Any]:
        final = self.history[-1] if self.history else {}
        keys = ("round", "test_auroc", "test_ap", "client_auroc_mean", "client_auroc_std", "train_loss")
        return json_safe(
            {
                "status": "failed" if error else "completed",
                "error": f"{type(error).__name__}: {error}" if error else None,
                "engine": "flower",
                "algorithm": self.cfg.algorithm,
                "rounds": self.done + 1,
                "num_clients": len(self.sites),
                "final": {k: final.get(k, math.nan) for k in keys},
                "communication": self.ledger.summary(),
                **({"privacy": self.dp.summary(self.done + 1)} if self.dp is not None else {}),
                "sites": [
                    {
                        "client": s.client,
                        "node": s.node,
                        "partition_id": s.order,
                        "samples": s.samples,
                        "positives": s.positives,
                    }
                    for s in self.sites
                ],  # fmt: skip
                "wall_seconds": round(self.clock() - self.start, 3),
                "config": {k.replace("_", "-"): v for k, v in vars(self.cfg).items()},
                "torch_version": torch.__version__,
            }
        )

    # -- talking to sites, with the node-loss policy -------------------------------------
    def _name(self, node: int) -> str:
        return self.by_node[node].name if node in self.by_node else f"node {node}"

    def _wait_for_nodes(self) -> list[int]:
        deadline = self.clock() + self.cfg.node_wait_timeout
        while len(nodes := self.transport.node_ids()) < self.cfg.min_nodes:
            if self.clock() >= deadline:
                raise FederationError(
                    f"only {len(nodes)} SuperNode(s) connected within node-wait-timeout = "
                    f"{self.cfg.node_wait_timeout:g} s; min-nodes = {self.cfg.min_nodes}"
                )
            self.sleep(0.5)
        return sorted(nodes)

    def _exchange(self, requests: dict[int, Packet], op: str, what: str) -> dict[int, Packet]:
        """Send and wait for every reply; any site error, departure or timeout fails the run."""
        handle = self.transport.send(requests, op)
        waiting, replies = set(requests), {}
        deadline, next_check = self.clock() + self.cfg.round_timeout, self.clock()
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
                        f"{what}: {', '.join(self._name(n) for n in sorted(gone))} left the federation "
                        "(its SuperNode shut down or stopped sending heartbeats); policy: the run stops"
                    )
                next_check = now + 1.0
            if now >= deadline:
                raise FederationError(
                    f"{what}: no reply from {', '.join(self._name(n) for n in sorted(waiting))} within "
                    f"round-timeout = {self.cfg.round_timeout:g} s; policy: the run stops"
                )
            self.sleep(self.poll_interval)
        errors = [f"{self._name(n)} failed: {r.error}" for n, r in sorted(replies.items()) if r.error]
        if errors:
            raise FederationError(f"{what}: " + "; ".join(errors))
        return replies


def _mean_std(values: list[float], name: str) -> dict[str, float]:
    valid = [v for v in values if v >= 0]  # −1: the site's AUROC is undefined (one class)
    mean = float(np.mean(valid)) if valid else math.nan
    return {f"{name}_mean": mean, f"{name}_std": float(np.std(valid)) if valid else math.nan}


class LocalTransport:
    """Sites in this process: the same handlers a Flower ClientApp runs, with packets deep-copied
    both ways and each site's saved state kept between messages, as a node's context is."""

    def __init__(self, run_config: dict[str, Any], node_configs: dict[int, dict[str, Any]]):
        self.run_config, self.node_configs = run_config, node_configs
        self.saved: dict[int, Packet | None] = dict.fromkeys(node_configs)
        self.messages = 0

    def node_ids(self) -> set[int]:
        return set(self.node_configs)

    def answer(self, node: int, request: Packet, op: str) -> Packet | None:
        """One site's reply (``None``: no reply, e.g. a site that vanished)."""
        config = self.node_configs[node]
        if op == "setup":
            return site_setup(config, self.run_config)
        reply, saved = site_step(config, self.run_config, self.saved[node], request)
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
