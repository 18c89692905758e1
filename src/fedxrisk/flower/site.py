"""A site: its own data, its client state, local steps, and ``communicate`` by replay.

``communicate(state, comm, ctx)`` is written for a process that can call
``comm.mean`` and wait for the answer. A Flower ClientApp cannot wait: it is
handed one message and returns one reply. So a site runs ``communicate``
against a :class:`ReplayCollective`: the k-th collective call returns the
server's answer when the site already has it, and otherwise stops the pass by
raising :class:`CollectiveRequest` with the payload, which becomes the reply.
When the answer arrives (the next message), ``communicate`` is run again from
the same saved pre-communication state; calls 0..k now return, call k + 1 (if
any) is sent. ``communicate`` has no randomness and the saved state is
reloaded for every pass, so each pass repeats the previous ones exactly: a
round with c collective calls costs c messages, and the message that
delivers a round's last answer also starts the next round's local steps.
An algorithm's ``begin`` hook (``begin_batch``) is replayed the same way
before round 0, with one batch drawn at the first step message.

The site handles the engine features as ``Simulation`` does: class-aware
batches (``positives_per_batch``), ``batch["uniform"]``
(``uniforms_per_step``), stage-end batches (``stage_batch_size``) and
``ClientInfo.max_samples`` (sent by the server, from the set-up counts).

Between messages everything a site needs lives in a :class:`Packet` that the
Flower ClientApp keeps in its ``Context.state`` (never sent): the state tree
(control variates, u estimates, score pools included), the pre-communication
state of a pending round with the answers so far, and the samplers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms import ClientInfo
from fedxrisk.algorithms.personal import site_collective
from fedxrisk.data.federated import training_batch
from fedxrisk.data.lazy import is_lazy
from fedxrisk.data.sampler import ClientSampler, make_samplers
from fedxrisk.data.stream import Stream, sampler_requests
from fedxrisk.engines import clientround as one_round
from fedxrisk.engines.simulation import LoopEngine
from fedxrisk.engines.validation import score_histograms
from fedxrisk.flower import site_personal as personal
from fedxrisk.flower.config import FlowerConfig, site_facts
from fedxrisk.flower.private import share_cap, site_counts, validation_share
from fedxrisk.flower.replay import CollectiveRequest, ReplayCollective, SiteError
from fedxrisk.flower.secure import VALIDATION, VALIDATION_NOISY, secure_counts, secure_share, site_clip
from fedxrisk.flower.sitedata import SiteData
from fedxrisk.flower.wire import Packet, flatten, unflatten
from fedxrisk.metrics import auroc, predict
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, is_finite, stack, tmap


def _sampler_json(sampler: ClientSampler) -> str:
    """A sampler's state (RNG and queues) as JSON, for the node's context."""
    return json.dumps(sampler.state_dict(), default=lambda a: np.asarray(a).tolist())


BEGIN, COMMUNICATE = "begin", "communicate"  # the two phases that call collectives
IDLE = torch.zeros(1, dtype=torch.bool)  # the participation mask of a site sitting a round out


@dataclass
class Pending:
    """A phase that waits for the server: its input state, its batch, and the answers so far.

    ``phase`` is ``communicate`` (the end of round ``round``; ``positions`` are
    the stage batch and ``round_positions`` the round batch, if the algorithm
    takes them) or ``begin`` (the algorithm's
    ``begin`` hook before round 0, whose bytes count in round 0; ``positions``
    and ``uniforms`` are its batch). The batch is rebuilt from them for every pass.
    """

    round: int
    state: Tree
    answers: list[tuple[str, Tree]] = field(default_factory=list)
    positions: np.ndarray | None = None
    uniforms: np.ndarray | None = None
    phase: str = COMMUNICATE
    round_positions: np.ndarray | None = None
    active: bool = True  # False: the site sits this round out (client sampling under DP)


class SiteRunner:
    """One site's client: built from the run config and the site's data, restored per message."""

    def __init__(self, cfg: FlowerConfig, site: SiteData):
        self.cfg, self.site = cfg, site
        self.plans: list = []  # the schedule: known once the server sends the positive ratio
        self.engine = LoopEngine()
        self.state: Tree | None = None  # stacked, leading axis 1
        self.pending: Pending | None = None
        self.clip = None  # SiteClip: client-level DP under SecAgg+ (set by initialize)
        self.stream: Stream | None = None  # lazily read inputs: decoded by data.stream.Stream
        self.done = -1  # last round finished

    # -- set-up ------------------------------------------------------------------
    def setup_metrics(self) -> dict[str, float]:
        """The counts docs/privacy.md lists as public; under DP or SecAgg+ only whether the site holds
        validation data, not how much."""
        site = self.site
        out = {"num-samples": site.num_samples, "num-positives": site.num_positives}
        if site.y_val is not None and self.cfg.private_reports:
            out["has-val"] = 1
        elif site.y_val is not None:
            out["num-val"] = len(site.y_val)
        return out

    def initialize(self, client: int, num_clients: int, pos_ratio: float, max_samples: int) -> None:
        """Build problem, algorithm, samplers and the initial state (first step message).

        As ``Simulation`` does: class-aware batches when the algorithm asks for
        ``positives_per_batch``; ``max_samples`` is the largest shard over all
        sites (the server computes it from the set-up counts); a fresh state of
        an algorithm with ``begin_batch`` starts with the ``begin`` phase pending.
        """
        self.client, self.num_clients, self.pos_ratio = client, num_clients, pos_ratio
        self.max_samples = max_samples
        run = self.cfg.run
        parts = self.cfg.assemble(site_facts(self.site.input_shape, pos_ratio, num_clients, max_samples))
        self.plans = list(parts.schedule.plan())
        self.algorithm, self.problem = parts.algorithm, parts.problem
        n, b, seed, ids = self.site.num_samples, run.batch_size, run.seed, [client]
        self.sampler, self.aux_sampler = make_samplers(
            [n], b, seed, ids, self.algorithm.positives_per_batch, [self.site.y.numpy()]
        )
        info = ClientInfo(client, n, float(self.site.y.mean()), max_samples)
        self.clip = site_clip(self.cfg, self.algorithm, info, num_clients)  # DP under SecAgg+ only
        if self.state is None:
            self.state = stack([self.algorithm.init(info)])
            if self.algorithm.begin_batch:  # before round 0; its collectives count in round 0
                self.pending = Pending(0, self.state, [], *self._draw(), phase=BEGIN)

    # -- persistence in the node's context -------------------------------------
    def save(self) -> Packet:
        config: dict[str, Any] = {
            "client": self.client, "num-clients": self.num_clients, "pos-ratio": self.pos_ratio,
            "max-samples": self.max_samples, "done": self.done, "sampler": _sampler_json(self.sampler),
            "aux-sampler": _sampler_json(self.aux_sampler), "pending": -1,
        }  # fmt: skip
        arrays = {"state": flatten(self.state)}
        if self.clip is not None:  # the last answers: references of the next clipped updates
            arrays["dp-last"] = dict(self.clip.last)
        if self.pending is not None:
            p = self.pending
            config.update(
                pending=p.round, phase=p.phase, kinds=json.dumps([k for k, _ in p.answers]), active=p.active
            )
            arrays["pending"] = flatten(p.state)
            for i, (_, answer) in enumerate(p.answers):
                arrays[f"answer.{i}"] = flatten(answer)
            parts = (
                ("positions", p.positions),
                ("uniforms", p.uniforms),
                ("round_positions", p.round_positions),
            )
            batch = {k: torch.from_numpy(v) for k, v in parts if v is not None}
            if batch:
                arrays["batch"] = batch
        return Packet(config=config, arrays=arrays)

    def restore(self, saved: Packet) -> None:
        c = saved.config
        self.state = unflatten(saved.arrays["state"])
        self.initialize(*init_args(c))
        if self.clip is not None:
            self.clip.last.update(saved.arrays.get("dp-last", {}))
        self.done = int(c["done"])
        self.sampler.load_state_dict(json.loads(c["sampler"]))
        self.aux_sampler.load_state_dict(json.loads(c["aux-sampler"]))
        if int(c["pending"]) >= 0:
            kinds = json.loads(c["kinds"])
            answers = [(k, unflatten(saved.arrays[f"answer.{i}"])) for i, k in enumerate(kinds)]
            batch = {k: v.numpy() for k, v in saved.arrays.get("batch", {}).items()}
            self.pending = Pending(
                int(c["pending"]), unflatten(saved.arrays["pending"]), answers, batch.get("positions"),
                batch.get("uniforms"), c["phase"], batch.get("round_positions"), bool(c.get("active", True)),
            )  # fmt: skip

    # -- a round -------------------------------------------------------------------
    def _draw(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The next training batch's positions ``[1, B]`` and uniforms (``Simulation._batch``'s order)."""
        positions = self.sampler.next()
        extra = self.algorithm.uniforms_per_step
        return positions, (self.sampler.uniforms(extra) if extra else None)

    def _stream(self) -> Any:
        """The site's :class:`~fedxrisk.data.stream.Stream` when its inputs are read lazily, else None."""
        if not is_lazy(self.site.x):
            return None
        if self.stream is None:
            x = self.site.x
            self.stream = Stream(
                x, [np.arange(len(x))], x.options.get("workers", 0), x.options.get("on_bad_file", "error")
            )
        return self.stream

    def _batch(self, positions: np.ndarray, uniforms: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """The simulation's batch (:func:`~fedxrisk.data.federated.training_batch`) from the site's rows."""
        local = torch.from_numpy(positions)
        stream = self._stream()
        x = stream.fetch(positions) if stream is not None else self.site.x[local]
        return training_batch(x, self.site.y[local], self.site.index[local], local, uniforms=uniforms)

    def _local_steps(self, r: int, active: bool = True) -> None:
        """The first half of :func:`~fedxrisk.engines.clientround.client_round`, as ``Simulation`` runs it: the
        round's local steps (a site sitting the round out, ``active`` False, keeps its state and is made
        ready for ``communicate`` as the simulation's idle clients are) and the extra batches."""
        plan = self.plans[r]
        stream = self._stream()
        if stream is not None and active:  # decode the round's steps ahead, as the simulation's stream does
            stream.start(sampler_requests(self.sampler, self.algorithm.uniforms_per_step, plan.window))
        mask = None if active else IDLE
        next_batch = lambda step, rows: self._batch(*self._draw())  # noqa: E731  (no instance-level DP on Flower)
        self.state = one_round.local_steps(self.algorithm, self.engine, self.state, plan, next_batch, mask)
        last = r + 1 == len(self.plans)
        stage, round_ = one_round.extra_positions(self.algorithm, plan, last, self.aux_sampler.sample)
        self.pending = Pending(r, self.state, [], stage, round_positions=round_, active=active)

    def _fine_tune_batch(self) -> dict[str, torch.Tensor]:
        """A fine-tuning step's batch: the next of the site's stream, as ``engines.personal.fine_tune``."""
        return self._batch(*self._draw())

    def _resume(self) -> CollectiveRequest | None:
        """Replay the pending phase with the answers so far: the next request, or None when done."""
        p = self.pending
        comm = site_collective(ReplayCollective(self.num_clients, p.answers), self.problem)  # FedBN, heads
        try:
            if p.phase == BEGIN:
                state = self.algorithm.begin(p.state, comm, self._batch(p.positions, p.uniforms))
            else:  # the second half of client_round, replayed
                ctx = one_round.round_context(
                    self.plans, p.round, p.positions, p.round_positions, self._batch
                )
                state = one_round.communicate(self.algorithm, p.state, comm, ctx, None if p.active else IDLE)
        except CollectiveRequest as request:
            return request
        if p.phase == COMMUNICATE:
            if not torch.isfinite(state["loss"]).all() or not is_finite(state["w"]):
                raise SiteError(
                    f"non-finite loss or model (NaN/inf) in round {p.round + 1}; training stopped"
                )
            self.done = p.round
        self.state, self.pending = state, None
        return None

    def report(self, with_model: bool) -> tuple[dict[str, float], dict[str, dict[str, torch.Tensor]]]:
        """The round's last loss; at evaluations the training AUROC, the model and the per-class counts
        of validation scores in fixed bins (``score_histograms``, as the distributed engine's ranks).
        Under DP or SecAgg+ no loss, no AUROC; the counts only inside SecAgg+'s sum (zeros without
        validation data), without SecAgg+ not at all."""
        private = self.cfg.private_reports
        metrics = {} if private else {"loss": float(self.state["loss"][0])}
        if not with_model:
            return metrics, {}
        params, buffers = glob = personal.global_at_site(self.problem, self.algorithm, self.state)
        if not private:
            metrics["train-auroc"] = _auroc(self.problem, params, buffers, self.site.x, self.site.y)
        own = personal.own_model(self.algorithm, self.state)
        metrics |= personal.site_numbers(self.cfg, self.site, self.problem, own, glob)
        arrays = {"model": flatten(personal.reported_model(self.problem, glob))}  # no personal entry
        if self.site.x_val is not None and self.site.y_val is not None:  # counts per bin, never a score
            scores = predict(self.problem, params, buffers, self.site.x_val)
            counts = site_counts(self.cfg, self.site.y_val.numpy(), scores)  # DP: the fixed mass
        else:  # no validation data: zeros of the histogram's shape
            counts = score_histograms(np.zeros(1), np.zeros(1), 1) * 0
        share = validation_share(self.cfg, counts, self.num_clients, self.done + 1, self.client)
        if share is not None:  # DP choosing on validation: this site's noised share (SecAgg+ only)
            cap = share_cap(self.cfg, share.size, self.num_clients)
            arrays["secure"] = {VALIDATION_NOISY: secure_share(torch.from_numpy(share), self.cfg, cap)}
        elif self.cfg.deploy.secure_aggregation:
            arrays["secure"] = {
                VALIDATION: secure_counts(torch.from_numpy(counts), self.cfg, self.num_clients)
            }
        elif not private and self.site.y_val is not None:
            arrays["validation"] = {"counts": torch.from_numpy(counts)}
        return metrics, arrays

    def step(self, request: Packet) -> Packet:
        """Deliver an answer (if any), finish and start rounds up to ``start``, reply."""
        c = request.config
        if "answer" in request.arrays:
            if self.pending is None or int(c["call"]) != len(self.pending.answers):
                raise SiteError(f"unexpected answer to collective #{c['call']} (site state out of step)")
            self.pending.answers.append((c["kind"], unflatten(request.arrays["answer"])))
            if self.clip is not None:
                self.clip.answered(self.pending.answers[-1][1])
        reply = Packet(config={"finished": -1, "pending": -1})
        while True:
            if self.pending is not None:
                p = self.pending
                wanted = self._resume()
                if wanted is not None:
                    payload = (
                        tmap(lambda x: x[0], wanted.payload)
                        if self.clip is None
                        else self.clip.update(wanted.payload)
                    )
                    if not p.active:  # sitting the round out: zeros, which add nothing to the sum
                        payload = tmap(torch.zeros_like, payload)
                    reply.config.update(
                        pending=p.round, phase=p.phase, call=wanted.call, kind=wanted.kind, key=wanted.key
                    )
                    reply.arrays["payload"] = flatten(payload)
                    return reply
                if p.phase == COMMUNICATE:
                    metrics, arrays = self.report(bool(c.get("report", False)))
                    reply.config["finished"] = self.done
                    reply.metrics.update(metrics)
                    reply.arrays.update(arrays)
                    reply.config.update(personal.rows_config(self.cfg, self.site) if arrays else {})
                    if self.done + 1 == len(self.plans):  # personalized: fine-tune, the sites' numbers
                        self.state, metrics, config = personal.finish(
                            self.cfg, self.site, self.problem, self.algorithm, self.engine, self.state,
                            self.plans[-1], self._fine_tune_batch,
                        )  # fmt: skip
                        reply.metrics.update(metrics)
                        reply.config.update(config)
            if self.done + 1 <= int(c.get("start", -1)) and self.done + 1 < len(self.plans):
                self._local_steps(self.done + 1, bool(c.get("active", True)))
            else:
                return reply


def init_args(config: Mapping[str, Any]) -> tuple[int, int, float, int]:
    """What the server tells a site at its first step message (and the site saves): client index,
    number of clients, positive ratio p, and the largest shard over all sites."""
    return (
        int(config["client"]),
        int(config["num-clients"]),
        float(config["pos-ratio"]),
        int(config["max-samples"]),
    )


def _auroc(problem: Problem, params: Tree, buffers: Tree, x: torch.Tensor, y: torch.Tensor) -> float:
    value = auroc(y.numpy(), predict(problem, params, buffers, x))
    return value if not math.isnan(value) else -1.0  # MetricRecord holds no NaN reliably: −1 = undefined
