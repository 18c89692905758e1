"""The sites a transport reaches, seen by :func:`fedxrisk.run.loop.train` as its simulation.

:class:`Federation` has the interface ``train`` drives (``run_round``, ``global_model``,
``train_loss``, ``ledger``, ``round``, ``done``, ``plans``, ``is_primary``): its
:meth:`~Federation.run_round` exchanges messages with the sites until they report the round
finished, reducing on the way the collectives they ask for (``comm.mean``: the mean over sites,
privatized by :class:`~fedxrisk.flower.private.ServerDP` or summed by SecAgg+; ``comm.gather``:
the stack of sites; ``comm.pool``: the valid records of all sites, shuffled). Evaluation, model
selection, early stopping, ``history.csv``, ``model.pt`` and ``summary.json`` are ``train``'s;
the federation adds what only it knows: the server's held-out metrics and the sites' own reports
(:meth:`~Federation.evaluate`), the sum of their validation histograms
(:meth:`~Federation.validation_counts`, turned into ``val_*`` by
:func:`~fedxrisk.engines.validation.federated_validation`) and the sites and the deployment
(:meth:`~Federation.summary_extra`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms import RoundPlan
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.pooling import merge_pool
from fedxrisk.engines.privacy.validation import SITE_MASS
from fedxrisk.engines.reporting import RunReporting
from fedxrisk.errors import ConfigError
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.personal import FlowerPersonal
from fedxrisk.flower.private import ServerDP, server_dp
from fedxrisk.flower.secure import secure_mean
from fedxrisk.flower.site import BEGIN
from fedxrisk.flower.sitedata import load_holdout
from fedxrisk.flower.transport import Exchange, FederationError, Site, Transport
from fedxrisk.flower.wire import Packet, flatten, unflatten
from fedxrisk.metrics import final_metrics, predict
from fedxrisk.problem import Problem
from fedxrisk.run.assemble import Facts
from fedxrisk.run.loop import evaluates
from fedxrisk.tree import Tree, stack, tmap


class Federation(RunReporting):
    """The sites of one Flower run: set up by :meth:`connect`, then driven round by round; it
    gives its own answers to every member :class:`RunReporting` declares."""

    is_primary = True  # the server writes the run's outputs
    remote_sites = True  # each site's state lives on its node (run/personalize.py)

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
        self.exchange = Exchange(transport, cfg.deploy.round_timeout, poll_interval, clock, sleep)
        self.ledger = ByteLedger()
        # seed of the score-pool shuffle: a server-only secret if FEDXRISK_POOL_SEED is set on the
        # server's host (sites cannot undo the shuffle); else the run seed, which the sites also know
        # (then Flower runs equal the simulation's; docs/privacy.md)
        self.pool_seed = int(os.environ.get("FEDXRISK_POOL_SEED", cfg.run.seed))
        self.sites: list[Site] = []
        self.pos_ratio, self.max_samples = math.nan, 0  # from the sites' set-up counts
        self.problem: Problem | None = None
        self.personal: FlowerPersonal | None = None  # a personalized run's per-site numbers
        self.algorithm: Any = None  # the server's copy: its hyperparameters, the schedule checks
        self.run_config = cfg.run  # after connect: the assembly's (its step size fixed for the data)
        self.plans: list[RoundPlan] = []  # the schedule: known once the sites' counts give p
        self.round = 0  # rounds the sites have finished
        self.dp: ServerDP | None = None  # client-level DP: the server clips and adds the noise
        self.holdout: tuple[torch.Tensor, torch.Tensor] | None = None
        self.num_val = 0
        self.validation_noised = False  # the last validation sum carries the sites' DP noise
        self._protocol: Iterator[dict[int, Packet]] | None = None
        self._reports: list[Packet] = []  # the sites' replies that finished the last round (client order)
        self._model: tuple[Tree, Tree] | None = None  # the global model of the last evaluated round

    # -- set-up ----------------------------------------------------------------------
    def connect(self) -> None:
        """Wait for the sites, ask each for its counts, build the problem, schedule and DP."""
        nodes = self.exchange.wait_for_nodes(self.cfg.deploy.min_nodes, self.cfg.deploy.node_wait_timeout)
        replies = self.exchange({n: Packet(config={"op": "setup"}) for n in nodes}, "setup", "set-up")
        sites = [_site(node, reply) for node, reply in replies.items()]
        orders = [s.order for s in sites if s.order is not None]
        if len(set(orders)) != len(orders):
            raise FederationError(f"two sites report the same partition-id: {sorted(orders)}")
        sites.sort(key=lambda s: (s.order is None, s.order if s.order is not None else 0, s.node))
        if len({s.input_shape for s in sites}) > 1:
            detail = ", ".join(f"node {s.node}: {s.input_shape}" for s in sites)
            raise FederationError(f"sites hold inputs of different shapes ({detail})")
        for k, s in enumerate(sites):
            s.client = k
        self.sites, self.exchange.by_node = sites, {s.node: s for s in sites}
        self.pos_ratio = sum(s.positives for s in sites) / sum(s.samples for s in sites)
        self.max_samples = max(s.samples for s in sites)  # ClientInfo.max_samples, as in simulation
        run = self.cfg.run
        self.num_val = sum(
            int(r.metrics.get("num-val", r.metrics.get("has-val", 0))) for r in replies.values()
        )  # under DP or SecAgg+: the sites holding validation data, else their validation samples
        parts = self.cfg.assemble(server_facts(sites, self.num_val))
        self.problem, self.algorithm = parts.problem, parts.algorithm  # the server's copy (hyperparameters)
        self.run_config = parts.config  # the run with the step size it trains with
        self.personal = FlowerPersonal(self.cfg, self.problem, len(sites))  # what stays on the sites
        self.plans = list(parts.schedule.plan())  # lr from the data, as `fedxrisk run` sets it
        self.holdout = load_holdout(self.cfg.deploy.test_data, self.cfg)
        if (run.selection == "best" or run.early_stopping) and not self.num_val:
            raise FederationError(
                "selection = 'best' / early-stopping choose on validation data, and no site holds any: "
                "set validation = FRACTION (trial sites) or give the sites a val.npz / val.csv"
            )
        self.dp = server_dp(self.cfg, parts, sites, self.log)
        self.participation = parts.participation  # among the connected sites (server_facts)
        self.log(
            f"{len(sites)} sites, {sum(s.samples for s in sites)} samples, positive ratio "
            f"{self.pos_ratio:.4f}; {run.algorithm} for {run.rounds} rounds, lr {self.plans[0].lr:.4g}"
        )

    # -- what train() drives ------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.round >= len(self.plans)

    def run_round(self) -> RoundPlan:
        """Exchange messages with the sites until they report the next round finished."""
        plan = self.plans[self.round]
        if self._protocol is None:
            self._protocol = self._exchanges()
        replies = next(self._protocol, None)
        if replies is None:
            raise FederationError(f"round {self.round + 1}: the sites stopped before finishing it")
        self.ledger.close_round()
        self.round += 1
        self._reports = [replies[s.node] for s in self.sites]
        if all("model" in r.arrays for r in self._reports):  # an evaluation round
            params, buffers = _global_model(self._reports)  # a personalized run: completed, as sites start
            model = self.personal.global_model({"params": params, "buffers": buffers})
            self._model = (model["params"], model["buffers"])
        return plan

    def global_model(self) -> tuple[Tree, Tree]:
        """The model the sites reported at the last evaluated round (the simulation's global model)."""
        if self._model is None:
            raise FederationError("no global model yet: the sites report it at evaluation rounds")
        return self._model

    def train_loss(self) -> float:
        """The mean of the last round's participants' losses, as the simulation's (an absent site
        reports its stale loss; NaN when none reports one: under DP or SecAgg+)."""
        active = self._participants(self.round - 1) if self.round > 0 else None
        losses = [
            r.metrics["loss"]
            for s, r in zip(self.sites, self._reports)
            if "loss" in r.metrics and (active is None or bool(active[s.client]))
        ]
        return float(np.mean(losses)) if losses else math.nan

    def evaluate(self, params: Tree, buffers: Tree) -> dict[str, Any]:
        """The row's test metrics on the server's held-out set (NaN without one) and the sites' own
        training AUROCs (``client_auroc_*``; −1 from a site: undefined; none under DP or SecAgg+)."""
        reported = [r.metrics.get("train-auroc", -1.0) for r in self._reports]
        sites = [v if v >= 0 else math.nan for v in reported]
        y, scores = np.zeros(0), np.zeros(0)
        if self.holdout is not None:
            y, scores = self.holdout[1].numpy(), predict(self.problem, params, buffers, self.holdout[0])
        return final_metrics(y, scores, sites)

    def validation_counts(self) -> np.ndarray | None:
        """The sum of the sites' ``[L, 2, B + 1]`` validation score histograms for the last evaluated
        model (under SecAgg+ the secure sum, the same on every reply; under DP the sum of the sites'
        noised shares, coarse bins: :attr:`validation_noised`); None when no site sends any."""
        if not self.num_val:
            return None
        noisy = [
            r.arrays["validation-noisy"]["counts"] for r in self._reports if "validation-noisy" in r.arrays
        ]
        self.validation_noised = bool(noisy)
        if noisy:  # DP: the sites' noised shares summed, coarse bins (flower/private.py validation_share)
            return noisy[0].numpy()
        secure = [r.arrays["validation-sum"]["counts"] for r in self._reports if "validation-sum" in r.arrays]
        if secure:
            return secure[0].numpy()
        counts = [r.arrays["validation"]["counts"] for r in self._reports if "validation" in r.arrays]
        return torch.stack(counts).sum(0).numpy() if counts else None

    # -- a personalized run: the sites' own numbers (flower/personal.py) ----------------------
    def personal_fields(self) -> tuple[str, ...]:
        return self.personal.fields()

    def personal_row(self) -> dict[str, float]:
        """The per-site columns of the last evaluated round, from the sites' reports."""
        return self.personal.row(self._reports)

    def personal_summary(self) -> dict[str, Any] | None:
        return self.personal.summary().get("personal")

    def summary_extra(self) -> dict[str, Any]:
        """summary.json's facts only the federation knows: the sites, their data, the deployment."""
        counts = [(s.positives, s.samples - s.positives) for s in self.sites]
        return {
            "engine": "flower",
            "num_clients": len(self.sites),
            "data": {
                "train_samples": sum(s.samples for s in self.sites),
                "train_pos_ratio": self.pos_ratio,
                "test_samples": 0 if self.holdout is None else len(self.holdout[1]),
                "client_counts": counts,
                "client_sites": None,  # the nodes are listed under "sites"
                "stream": None,
            },
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
            "deployment": dataclasses.asdict(self.cfg.deploy),
        }

    def state_dict(self) -> dict[str, Any]:
        raise ConfigError("a Flower run keeps no checkpoint: each site's state lives on its own node")

    # -- the protocol (flower/site.py is the sites' side) ----------------------------------
    def _exchanges(self) -> Iterator[dict[int, Packet]]:
        """Send the requests, reduce the collective the replies ask for, answer; yield the replies
        each time the sites report a round finished (they then carry its report)."""
        report = lambda r: evaluates(self.cfg.run, r + 1, len(self.plans))  # noqa: E731  (0-based r)
        init = {"num-clients": len(self.sites), "pos-ratio": self.pos_ratio, "max-samples": self.max_samples}
        requests = self._packets({**init, "start": 0, "report": report(0)}, first=True)
        op = "secure-step" if self.cfg.deploy.secure_aggregation else "step"
        last = len(self.plans) - 1
        while True:
            what = f"round {self.round + 1}/{len(self.plans)}"  # 1-based, as in history.csv
            replies = self.exchange(requests, op, what)
            finished = self._common(replies, "finished", what)
            pending = self._common(replies, "pending", what)
            if finished >= 0:
                yield replies
            if pending < 0:
                if self.round > last:
                    return
                start = self.round  # a round without collectives: start the next one
                requests = self._packets({"start": start, "report": report(start)})
                continue
            answer, kind, call = self._reduce(replies, pending)
            if self._common(replies, "phase", what) == BEGIN:  # the begin hook: then round 0 starts
                nxt = pending
            else:
                nxt = pending + 1 if pending < last else -1
            config = {"call": call, "kind": kind, "start": nxt, "report": report(pending)}
            requests = self._packets(config, {"answer": answer})

    def _packets(
        self, config: dict[str, Any], arrays: dict[str, Any] | None = None, first: bool = False
    ) -> dict[int, Packet]:
        """One request per site; under client sampling each site learns whether it takes part in the
        round the request starts (``active``); ``first``: the site's client index too."""
        start = int(config["start"])
        active = self._participants(start) if start >= 0 else None
        return {
            s.node: Packet(
                config={
                    **config,
                    **({"client": s.client} if first else {}),
                    **({"active": bool(active[s.client])} if active is not None else {}),
                },
                arrays=dict(arrays or {}),
            )
            for s in self.sites
        }

    def _participants(self, round_: int) -> torch.Tensor | None:
        """The sites taking part in round ``round_``: DP's draw, or ``clients-per-round``'s; None: all."""
        if self.dp is not None:
            return self.dp.participants(round_)
        return None if self.participation is None else self.participation.mask(round_)

    def _mean(self, stacked: Tree) -> Tree:
        """The sites' mean; under ``clients-per-round`` the participants' (the others sent zeros)."""
        if self.participation is None:
            return tmap(lambda x: x.mean(0), stacked)
        return tmap(lambda x: x.sum(0) / self.participation.count, stacked)  # type: ignore[union-attr]

    def _reduce(self, replies: dict[int, Packet], round_: int) -> tuple[dict[str, torch.Tensor], str, int]:
        """The server side of ``comm.mean`` (mean over sites), ``comm.gather`` (stack of sites) and
        ``comm.pool`` (valid records of all sites, shuffled: :func:`~fedxrisk.engines.pooling.merge_pool`)."""
        what = f"round {round_ + 1}/{len(self.plans)}"
        kind, call = self._common(replies, "kind", what), self._common(replies, "call", what)
        if self.cfg.deploy.secure_aggregation:  # SecAgg+: the sites' mean arrives, never a site's payload
            return secure_mean(self, replies, round_, what), kind, call
        payloads = [replies[s.node].arrays["payload"] for s in self.sites]
        for s, payload in zip(self.sites, payloads):
            if list(payload) != list(payloads[0]):
                raise FederationError(
                    f"{what}: {s.name} sent tensors {list(payload)}, {self.sites[0].name} sent {list(payloads[0])}"
                )
        stacked = stack([unflatten(p) for p in payloads])  # leading axis: clients, as in simulation
        if kind == "pool":  # valid records of all sites, shuffled here; the masks stay on the server
            key = self._common(replies, "key", what)
            reduced = merge_pool(stacked["groups"], stacked["valid"], self.pool_seed, key)
            self.ledger.record_pool(stacked["groups"], stacked["valid"], reduced)
            return flatten(reduced), kind, call
        self.ledger.record(kind, stacked if isinstance(stacked, dict) else {"": stacked}, len(self.sites))
        if kind == "mean":
            reduced = self.dp.mean(stacked, round_) if self.dp is not None else self._mean(stacked)
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


def server_facts(sites: list[Site], val_sites: int) -> Facts:
    """What the server knows at set-up: the sites' input shape and counts (binary labels); the
    validation release's class masses assume each of the ``val_sites`` sites holding validation
    data holds both classes (under DP a site says only whether it holds any)."""
    samples = [s.samples for s in sites]
    masses = (lambda dp: [(float(SITE_MASS * val_sites),) * 2]) if val_sites else None  # noqa: E731
    pos_ratio = sum(s.positives for s in sites) / sum(samples)
    return Facts(
        sites[0].input_shape,
        1,
        pos_ratio,
        len(sites),
        max(samples),
        sum(samples),
        min(samples),
        masses,
        shard_sizes=tuple(samples),
    )


def _site(node: int, reply: Packet) -> Site:
    """A site from its set-up reply: its order (``partition-id``), counts and input shape."""
    counts = int(reply.metrics["num-samples"]), int(reply.metrics["num-positives"])
    return Site(node, reply.config.get("order"), *counts, tuple(json.loads(reply.config["input-shape"])))


def _global_model(reports: list[Packet]) -> tuple[Tree, Tree]:
    """The simulation's global model from the sites' reported models (in client order): client 0's
    parameters, the client mean of float buffers."""
    models = [unflatten(r.arrays["model"]) for r in reports]
    buffers = {
        k: torch.stack([m["buffers"][k].float() for m in models]).mean(0).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in models[0].get("buffers", {}).items()
    }
    return models[0]["params"], buffers
