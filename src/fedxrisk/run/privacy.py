"""The ``[privacy]`` section of a run: differential privacy settings, their checks, and the plan.

Keys (all optional but ``clip`` and one of ``noise_multiplier`` / ``target_epsilon``)::

    [privacy]
    level = "client"          # "client" (DP-FedAvg around the round's mean) or "instance" (DP-SGD)
    clip = 1.0                # L2 norm C: of a client's joint round update, or of one sample's gradient
    noise_multiplier = 1.1    # σ: noise std / C ...
    target_epsilon = 3.0      # ... or ε to reach after the planned rounds (σ by bisection)
    delta = "none"            # "none": 1/N, N the training samples (see below)
    sampling_rate = 1.0       # client level: the fraction q of clients per round
    sampling = "poisson"      # or "fixed" (round(q·K) clients, without replacement)
    noise_seed = "none"       # "none": the run seed

δ's default is 1/N with N the training samples, at both levels. At client level the unit is a
client, for which the usual rule is δ ≪ 1/K; 1/N ≤ 1/(K·smallest shard) is smaller still, so
one default serves both levels and ε numbers of the two levels use the same δ.

:func:`privacy_from_table` type-checks the table, :func:`check_privacy` checks it against the
run (one line per refusal), :func:`plan_privacy` turns it into the engine's
:class:`~fedxrisk.engines.privacy.ClientDP` or an instance-private algorithm, and a
:class:`PrivacyPlan` that reports ε(δ) after any number of rounds.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedxrisk.errors import ConfigError

LEVELS = ("client", "instance")
KEYS: dict[str, tuple[type, ...]] = {
    "level": (str,),
    "clip": (float,),
    "noise_multiplier": (float, type(None)),
    "target_epsilon": (float, type(None)),
    "delta": (float, type(None)),
    "sampling_rate": (float,),
    "sampling": (str,),
    "noise_seed": (int, type(None)),
}
DEFAULTS: dict[str, Any] = {
    "level": "client", "noise_multiplier": None, "target_epsilon": None, "delta": None,
    "sampling_rate": 1.0, "sampling": "poisson", "noise_seed": None,
}  # fmt: skip


def _value(key: str, value: Any) -> Any:
    allowed = KEYS[key]
    if type(None) in allowed and (value is None or value == "none"):
        return None
    if float in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if int in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if str in allowed and isinstance(value, str):
        return value
    names = " or ".join(
        {float: "a number", int: "an integer", str: "a string"}.get(t, '"none"') for t in allowed
    )
    raise ConfigError(f"privacy.{key}: expected {names}, got {value!r} ({type(value).__name__})")


def privacy_from_table(table: Any) -> dict[str, Any]:
    """A ``[privacy]`` table, type-checked, with every key filled (defaults)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"[privacy] must be a table of keys, got {table!r}")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"unknown key privacy.{unknown[0]}; [privacy] allows: {', '.join(KEYS)}")
    if "clip" not in table:
        raise ConfigError("privacy.clip is missing: the L2 clipping norm C (e.g. clip = 1.0)")
    return {**DEFAULTS, **{k: _value(k, v) for k, v in table.items()}}


def _algorithm_stub(cfg: Any) -> Any:
    """What the refusal checks read of an algorithm, before any model or data exists."""
    from fedxrisk.algorithms import ALGORITHMS

    cls = ALGORITHMS[cfg.algorithm]
    attrs = {k: cfg.options.get(k, getattr(cls, k, 0)) for k in ("stage_batch_size", "round_batch_size")}
    problem = types.SimpleNamespace(
        pos_ratio_mode=cfg.pos_ratio_mode, buffer_policy="average", init_model=lambda: ({}, {})
    )  # BatchNorm refusals need the model: build() runs the full check
    return types.SimpleNamespace(name=cfg.algorithm, begin_batch=cls.begin_batch, problem=problem, **attrs)


def check_privacy(cfg: Any) -> None:
    """One-line :class:`ConfigError` for a ``[privacy]`` table the run cannot honour."""
    p = cfg.privacy
    if p is None:
        return
    if not isinstance(p, Mapping):
        raise ConfigError(f"privacy must be a table of settings or None, got {p!r}")
    p = privacy_from_table(p)
    if cfg.pretrain is not None:
        raise ConfigError(
            "privacy with a [pretrain] stage: the accountant does not compose two stages; drop one"
        )
    from fedxrisk.engines.privacy import (
        ClientDP,
        ClientSampling,
        unsupported_instance_reason,
        unsupported_reason,
    )

    if p["level"] not in LEVELS:
        raise ConfigError(f"privacy.level must be one of {LEVELS}, got {p['level']!r}")
    if (p["noise_multiplier"] is None) == (p["target_epsilon"] is None):
        raise ConfigError("privacy: set exactly one of privacy.noise_multiplier and privacy.target_epsilon")
    if p["noise_multiplier"] is not None and not 0 < p["noise_multiplier"] < math.inf:
        raise ConfigError(
            f"privacy.noise_multiplier must be a finite number > 0 (σ = 0 adds no noise: ε would be "
            f"infinite), got {p['noise_multiplier']:g}; drop [privacy] for a run without DP"
        )
    if p["target_epsilon"] is not None and not (0 < p["target_epsilon"] < math.inf):
        raise ConfigError(f"privacy.target_epsilon must be a finite number > 0, got {p['target_epsilon']}")
    if p["delta"] is not None and not 0.0 < p["delta"] < 1.0:
        raise ConfigError(f"privacy.delta must lie in (0, 1), got {p['delta']}")
    if p["noise_seed"] is not None and p["noise_seed"] < 0:
        raise ConfigError(f"privacy.noise_seed must be ≥ 0, got {p['noise_seed']}")
    ClientDP(p["clip"], p["noise_multiplier"] or 0.0, ClientSampling(p["sampling_rate"], p["sampling"]))
    q, k = p["sampling_rate"], cfg.clients
    if p["level"] == "client" and p["sampling"] == "fixed" and q < 1.0 and round(q * k) < 1:
        raise ConfigError(
            f"privacy.sampling_rate = {q:g} with sampling 'fixed' draws round(q·K) = 0 of K = {k} clients "
            f"per round; set sampling_rate above {1 / (2 * k):.3g} (one client) or sampling = 'poisson'"
        )
    stub = _algorithm_stub(cfg)
    if p["level"] == "client":
        reason = unsupported_reason(stub)
        if reason is not None:
            raise ConfigError(f"privacy.level = 'client': {reason}")
        if cfg.buffer_policy == "local":
            raise ConfigError(
                "privacy.level = 'client' with model.buffer_policy = 'local': the evaluated model would "
                "average the clients' BatchNorm statistics without noise; use buffer_policy 'average'"
            )
        return
    reason = unsupported_instance_reason(stub)
    if reason is not None:
        raise ConfigError(f"privacy.level = 'instance': {reason}")
    if p["sampling_rate"] < 1.0:
        raise ConfigError("privacy.sampling_rate < 1 is client sampling: it applies to level = 'client' only")
    if cfg.engine == "compile":
        raise ConfigError(
            "privacy.level = 'instance' runs on engines loop, vmap and distributed, not compile"
        )


@dataclass(frozen=True)
class PrivacyPlan:
    """A run's DP guarantee: ε(δ) after any number of completed rounds (:meth:`epsilon`)."""

    level: str
    clip: float
    noise_multiplier: float
    delta: float
    q: float  # client level: clients per round / K; instance level: batch / smallest shard
    sampling: str
    num_clients: int
    steps_per_round: tuple[int, ...]  # accountant steps of each planned round (1 or its local steps)
    target_epsilon: float | None = None

    def epsilon(self, rounds: int) -> float:
        """ε at δ after the first ``rounds`` rounds (RDP accountant of dp-accounting)."""
        from fedxrisk.engines.privacy import epsilon

        steps = sum(self.steps_per_round[:rounds])
        n = self.num_clients if self.level == "client" else None
        return epsilon(self.noise_multiplier, steps, self.delta, self.q, self.sampling, n)

    def describe(self) -> str:
        """The guarantee in one line (printed at the start of a run)."""
        rounds = len(self.steps_per_round)
        unit = "client (all its records)" if self.level == "client" else "record"
        sampling = f", {self.sampling} sampling q = {self.q:.4g}" if self.q < 1 else ""
        return (
            f"differential privacy: ({self.epsilon(rounds):.3g}, {self.delta:.3g})-DP per {unit} after "
            f"{rounds} rounds (C = {self.clip:g}, σ = {self.noise_multiplier:.4g}{sampling})"
        )

    def summary(self, rounds: int) -> dict[str, Any]:
        return {
            "level": self.level, "epsilon": self.epsilon(rounds), "delta": self.delta, "clip": self.clip,
            "noise_multiplier": self.noise_multiplier, "target_epsilon": self.target_epsilon,
            "sampling_rate": self.q, "sampling": self.sampling, "accountant": "RDP (dp-accounting)",
        }  # fmt: skip


def plan_privacy(cfg: Any, algorithm: Any, data: Any, schedule: Any, batch_size: int) -> tuple[Any, Any, Any]:
    """(algorithm to train — instance level: its DP-SGD copy —, the engine's ClientDP or None,
    the :class:`PrivacyPlan`); all None-free when ``cfg.privacy`` is None: (algorithm, None, None)."""
    if cfg.privacy is None:
        return algorithm, None, None
    from fedxrisk.engines.privacy import (
        ClientDP,
        ClientSampling,
        check_client_dp,
        instance_private,
        noise_for_epsilon,
    )

    p = privacy_from_table(cfg.privacy)
    plans = list(schedule.plan())
    delta = p["delta"] if p["delta"] is not None else 1.0 / len(data.data.y_train)
    if p["level"] == "client":
        check_client_dp(algorithm)
        q, sampling, steps = p["sampling_rate"], p["sampling"], tuple(1 for _ in plans)
    else:
        q = min(1.0, batch_size / min(data.shard_sizes))
        sampling, steps = "poisson", tuple(plan.window for plan in plans)
    n = data.num_clients if p["level"] == "client" else None
    sigma = p["noise_multiplier"]
    if sigma is None:
        sigma = noise_for_epsilon(p["target_epsilon"], sum(steps), delta, q, sampling, n)
    plan = PrivacyPlan(
        p["level"], p["clip"], sigma, delta, q, sampling, data.num_clients, steps, p["target_epsilon"]
    )
    if p["level"] == "instance":
        return instance_private(algorithm, p["clip"], sigma), None, plan
    return algorithm, ClientDP(p["clip"], sigma, ClientSampling(q, sampling), p["noise_seed"]), plan
