"""The server's round loop: set-up, collectives as server-side reductions, evaluation, policy.

The :class:`Coordinator` knows sites only through a
:class:`~fedxrisk.flower.transport.Transport`; :class:`~fedxrisk.flower.transport.Exchange`
sends and waits under the node-loss policy, :class:`~fedxrisk.flower.outputs.RunOutputs`
writes ``history.csv``, ``model.pt`` and ``summary.json``.

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

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.pooling import merge_pool
from fedxrisk.flower.config import FlowerConfig, to_flat
from fedxrisk.flower.outputs import LAST_MODEL, RunOutputs, global_model, mean_std, summed_validation
from fedxrisk.flower.personal import FlowerPersonal
from fedxrisk.flower.private import ServerDP, server_dp
from fedxrisk.flower.secure import check_secure_algorithm, secure_mean
from fedxrisk.flower.site import BEGIN
from fedxrisk.flower.sitedata import load_holdout
from fedxrisk.flower.transport import Exchange, FederationError, LocalTransport, Site, Transport
from fedxrisk.flower.wire import Packet, flatten, unflatten
from fedxrisk.problem import Problem
from fedxrisk.run.callbacks import BestModel, EarlyStopping, LoopState, selection_callbacks
from fedxrisk.run.folder import json_safe
from fedxrisk.run.loop import selected_record
from fedxrisk.run.privacy_outputs import privacy_row
from fedxrisk.tree import Tree, stack, tmap

__all__ = ["Coordinator", "FederationError", "LocalTransport", "Site", "Transport"]


def _mean(values: list[float]) -> float:
    """The mean over sites (NaN when no site reports it: under DP or SecAgg+ none does)."""
    return float(torch.tensor(values).mean()) if values else math.nan


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
        self.clock = clock
        self.exchange = Exchange(transport, cfg.deploy.round_timeout, poll_interval, clock, sleep)
        self.outputs = RunOutputs(cfg)
        self.callbacks = selection_callbacks(cfg.run)
        self.state = LoopState(cfg.run, self.outputs.out, cfg.run.rounds, history=self.outputs.history)
        self.state.global_model = lambda: (self.model["params"], self.model["buffers"])  # type: ignore[index]
        self.plans: list = []  # the schedule: known once the sites' counts give the positive ratio
        self.ledger = ByteLedger()
        # seed of the score-pool shuffle: a server-only secret if FEDXRISK_POOL_SEED is set on the
        # server's host (sites cannot undo the shuffle); else the run seed, which the sites also know
        # (then Flower runs equal the simulation's; docs/privacy.md)
        self.pool_seed = int(os.environ.get("FEDXRISK_POOL_SEED", cfg.run.seed))
        self.sites: list[Site] = []
        self.done = -1
        self.model: dict[str, Tree] | None = None
        self.dp: ServerDP | None = None  # client-level DP: the server clips and adds the noise

    # -- the run -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train; write ``history.csv``, ``model.pt`` and ``summary.json`` to ``out-dir``."""
        self.start = self.clock()
        error: Exception | None = None
        with self.outputs.open():
            try:
                self._setup()
                self._rounds()
            except Exception as e:  # recorded in summary.json, then re-raised
                error = e
        summary = self._summary(error)
        self.outputs.write_summary(summary)
        if error is not None:
            self.log(f"run failed: {error}")
            raise error
        self.log(f"run completed: {json.dumps(json_safe(summary['final']))}")
        return json_safe(summary)

    def _setup(self) -> None:
        check_secure_algorithm(self.cfg)  # before any message: SecAgg+ carries means only
        nodes = self.exchange.wait_for_nodes(self.cfg.deploy.min_nodes, self.cfg.deploy.node_wait_timeout)
        replies = self.exchange({n: Packet(config={"op": "setup"}) for n in nodes}, "setup", "set-up")
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
        self.sites, self.exchange.by_node = sites, {s.node: s for s in sites}
        self.pos_ratio = sum(s.positives for s in sites) / sum(s.samples for s in sites)
        self.max_samples = max(s.samples for s in sites)  # ClientInfo.max_samples, as in simulation
        model = self.cfg.build_model(sites[0].input_shape)
        run = self.cfg.run
        self.problem = Problem(model, self.pos_ratio, run.buffer_policy, run.pos_ratio_mode)
        self.personal = FlowerPersonal(self.cfg, self.problem, len(sites))  # what stays on the sites
        self.outputs.extend_fields(self.personal.fields())
        schedule = self.cfg.schedule(self.pos_ratio)  # lr from the data, as `fedxrisk run` sets it
        self.plans = list(schedule.plan())
        try:  # the schedule checks engines make (CoDA's stages, LocalSCGDAM's rates)
            self.cfg.build_algorithm(self.problem).validate_schedule(schedule)
        except ValueError as e:
            raise FederationError(f"{run.algorithm}: {e}") from e
        self.holdout = load_holdout(self.cfg.deploy.test_data, self.cfg)
        self.num_val = sum(
            int(r.metrics.get("num-val", r.metrics.get("has-val", 0))) for r in replies.values()
        )
        if self.callbacks and not self.num_val:
            raise FederationError(
                "selection = 'best' / early-stopping choose on validation data, and no site holds any: "
                "set validation = FRACTION (trial sites) or give the sites a val.npz / val.csv"
            )
        self.dp = server_dp(self.cfg, self.problem, sites, self.max_samples, self.log)
        self.log(
            f"{len(sites)} sites, {sum(s.samples for s in sites)} samples, positive ratio "
            f"{self.pos_ratio:.4f}; {run.algorithm} for {run.rounds} rounds, lr {self.plans[0].lr:.4g}"
        )

    def _rounds(self) -> None:
        init = {"num-clients": len(self.sites), "pos-ratio": self.pos_ratio, "max-samples": self.max_samples}
        requests = self._packets({**init, "start": 0, "report": self.cfg.is_eval_round(0)}, first=True)
        last = len(self.plans) - 1
        while True:
            what = f"round {self.done + 2}/{len(self.plans)}"  # 1-based, as in history.csv
            replies = self.exchange(
                requests, "secure-step" if self.cfg.deploy.secure_aggregation else "step", what
            )
            finished, pending = (
                self._common(replies, "finished", what),
                self._common(replies, "pending", what),
            )
            if finished >= 0:
                self._finish_round(finished, replies)
                if self.state.should_stop:  # early stopping: the sites' next round is abandoned
                    return
            if pending < 0:
                if self.done >= last:
                    return
                start = self.done + 1  # a round without collectives: start the next one
                requests = self._packets({"start": start, "report": self.cfg.is_eval_round(start)})
                continue
            answer, kind, call = self._reduce(replies, pending)
            if self._common(replies, "phase", what) == BEGIN:  # the begin hook: then round 0 starts
                nxt = pending
            else:
                nxt = pending + 1 if pending < last else -1
            config = {"call": call, "kind": kind, "start": nxt, "report": self.cfg.is_eval_round(pending)}
            requests = self._packets(config, {"answer": answer})

    def _packets(
        self, config: dict[str, Any], arrays: dict[str, Any] | None = None, first: bool = False
    ) -> dict[int, Packet]:
        """One request per site; under client sampling each site learns whether it takes part in the
        round the request starts (``active``); ``first``: the site's client index too."""
        start = int(config["start"])
        active = self.dp.participants(start) if self.dp is not None and start >= 0 else None
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

    # -- collectives ----------------------------------------------------------------
    def _reduce(self, replies: dict[int, Packet], round_: int) -> tuple[dict[str, torch.Tensor], str, int]:
        """The server side of ``comm.mean`` (mean over sites), ``comm.gather`` (stack of sites) and
        ``comm.pool`` (valid records of all sites, shuffled: :func:`~fedxrisk.engines.pooling.merge_pool`)."""
        what = f"round {round_ + 1}/{len(self.plans)}"
        kind, call = self._common(replies, "kind", what), self._common(replies, "call", what)
        if self.cfg.deploy.secure_aggregation:  # SecAgg+: the sites' mean arrives, never a site's payload
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
        self.model = self.personal.global_model(global_model(ordered))
        plan = self.plans[r]
        row = {
            "round": r + 1, "step": plan.first_step + plan.window, "stage": plan.stage, "lr": plan.lr,
            "train_loss": _mean([rep.metrics["loss"] for rep in ordered if "loss" in rep.metrics]),
            **self.outputs.test_metrics(self.problem, self.model, self.holdout),
            **summed_validation(ordered if self.num_val else []),
            **mean_std([rep.metrics.get("train-auroc", -1.0) for rep in ordered], "client_auroc"),
            "bytes_up_per_client": self.ledger.total_up, "bytes_down_per_client": self.ledger.total_down,
            "wall_seconds": round(self.clock() - self.start, 4),
            **(privacy_row(self.dp, r + 1) if self.dp is not None else {}),  # fedxrisk run's columns
            **self.personal.row(ordered),  # per-site columns of a personalized run
        }  # fmt: skip
        self.outputs.add_row(row)
        self.state.round = r + 1
        for cb in self.callbacks:
            cb.on_evaluation(row, self.state)
        chosen = self._callback(BestModel)
        if chosen is not None:
            self.outputs.save_model(self.model, self.sites[0].input_shape, LAST_MODEL)
        if chosen is None or chosen.row is None or chosen.row["round"] == row["round"]:
            self.outputs.save_model(self.model, self.sites[0].input_shape)  # the selected model
        val = f", val AUROC {row['val_auroc']:.4f} ± {row['val_auroc_bound']:.1e}" if self.num_val else ""
        self.log(
            f"round {r + 1}/{len(self.plans)}: train loss {row['train_loss']:.4f}, test AUROC "
            f"{row['test_auroc']:.4f}, site AUROC {row['client_auroc_mean']:.4f}{val}"
        )

    def _resolved(self) -> Any:
        """The run config with the step size it trained with (known once the sites' counts are)."""
        ratio = getattr(self, "pos_ratio", None)
        return self.cfg.run if ratio is None else self.cfg.resolved(ratio)

    def _callback(self, kind: type) -> Any:
        return next((cb for cb in self.callbacks if isinstance(cb, kind)), None)

    def _stopping(self) -> dict[str, Any]:
        stopper = self._callback(EarlyStopping)
        if stopper is None:
            return {}
        return {"early_stopping": {"patience": stopper.patience, "stopped_at_round": stopper.stopped_round}}

    def _summary(self, error: Exception | None) -> dict[str, Any]:
        final = self.outputs.history[-1] if self.outputs.history else {}
        keys = ("round", "test_auroc", "test_ap", "client_auroc_mean", "client_auroc_std", "train_loss")
        return {
            "status": "failed" if error else "completed",
            "error": f"{type(error).__name__}: {error}" if error else None,
            "engine": "flower",
            "algorithm": self.cfg.run.algorithm,
            "rounds": self.done + 1,
            "num_clients": len(self.sites),
            "final": {k: final.get(k, math.nan) for k in keys},
            "selected": selected_record(self.cfg.run, self.outputs.history, self._callback(BestModel)),
            **self._stopping(),
            "communication": self.ledger.summary(),
            **({"privacy": self.dp.summary(self.done + 1)} if self.dp is not None else {}),
            **(self.personal.summary() if hasattr(self, "personal") else {}),
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
            "config": to_flat(self._resolved(), self.cfg.deploy),
            "torch_version": torch.__version__,
        }
