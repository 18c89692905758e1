"""``[privacy]`` checked against the run, every refusal at once (:func:`privacy_errors`).

Each rule of a ``[privacy]`` table that stands alone (a range, a key the run cannot honour) is
reported on its own line; a rule that reads another setting's value runs once that value passed its
own rule (the accountant's bounds once σ / ε are numbers it accepts; the level's refusals once
``privacy.level`` is known). :func:`check_privacy` is the rule :mod:`fedxrisk.run.rules` registers:
it raises the one error, or a :class:`~fedxrisk.errors.ConfigErrors` holding them all.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any

from fedxrisk.errors import ConfigError, raise_all
from fedxrisk.run.privacy import LEVELS, privacy_table


def _algorithm_stub(cfg: Any) -> Any:
    """What the refusal checks read of an algorithm, before any model or data exists."""
    from fedxrisk.algorithms import ALGORITHMS

    cls = ALGORITHMS[cfg.algorithm]
    attrs = {k: cfg.options.get(k, getattr(cls, k, 0)) for k in ("stage_batch_size", "round_batch_size")}
    problem = types.SimpleNamespace(
        pos_ratio_mode=cfg.pos_ratio_mode, buffer_policy="average", init_model=lambda: ({}, {})
    )  # BatchNorm refusals need the model: build() runs the full check
    names = ("couples_samples", "uses_pos_ratio", "declares_sample_loss", "touches_labels")
    declared = {k: getattr(cls, k) for k in names}
    positives = cfg.resolved_positives()
    return types.SimpleNamespace(
        name=cfg.algorithm, collectives=cls.collectives, problem=problem, positives_per_batch=positives,
        **declared, **attrs,
    )  # fmt: skip


def check_privacy(cfg: Any) -> None:
    """Raise the refusal of a ``[privacy]`` table the run cannot honour (several: :class:`ConfigErrors`)."""
    raise_all(privacy_errors(cfg))


def privacy_errors(cfg: Any) -> list[ConfigError]:
    """Every one-line :class:`ConfigError` of ``cfg.privacy`` against the run, in a fixed order."""
    if cfg.privacy is None:
        return []
    if not isinstance(cfg.privacy, Mapping):
        return [ConfigError(f"privacy must be a table of settings or None, got {cfg.privacy!r}")]
    errors: list[ConfigError] = []
    p = privacy_table(cfg.privacy, errors)

    def rule(broken: bool, message: str) -> bool:
        if broken:
            errors.append(ConfigError(message))
        return broken

    def call(one: Callable[[], Any]) -> bool:
        try:
            one()
        except ConfigError as e:
            errors.append(e)
            return True
        return False

    from fedxrisk.engines.privacy import (
        ClientDP,
        ClientSampling,
        unsupported_instance_reason,
        unsupported_reason,
    )
    from fedxrisk.engines.privacy.accountant import input_refusal

    sigma, eps, z, bins = p["noise_multiplier"], p["target_epsilon"], p["validation_noise_multiplier"], p["validation_bins"]  # fmt: skip
    rule(
        cfg.pretrain is not None,
        "privacy with a [pretrain] stage: the accountant does not compose two stages; drop one",
    )
    bad_level = rule(p["level"] not in LEVELS, f"privacy.level must be one of {LEVELS}, got {p['level']!r}")
    bad = rule(
        (sigma is None) == (eps is None),
        "privacy: set exactly one of privacy.noise_multiplier and privacy.target_epsilon",
    )
    bad |= rule(
        sigma is not None and not 0 < sigma < math.inf,
        f"privacy.noise_multiplier must be a finite number > 0 (σ = 0 adds no noise: ε would be "
        f"infinite), got {sigma or 0:g}; drop [privacy] for a run without DP",
    )
    bad |= rule(
        eps is not None and not 0 < eps < math.inf,
        f"privacy.target_epsilon must be a finite number > 0, got {eps}",
    )
    rule(
        p["delta"] is not None and not 0.0 < p["delta"] < 1.0,
        f"privacy.delta must lie in (0, 1), got {p['delta']}",
    )
    rule(
        p["reproducible_noise"] is not None and p["reproducible_noise"] < 0,
        f"privacy.reproducible_noise must be ≥ 0, got {p['reproducible_noise']}",
    )
    bad |= rule(
        not 0 < z < math.inf or not 3 <= bins <= 4096,
        "privacy.validation_noise_multiplier must be a finite number > 0 and privacy.validation_bins an "
        f"integer in [3, 4096], got {z:g} and {bins}",
    )
    if not bad:  # the accountant's bounds, on numbers it reads
        reason = input_refusal(sigma, eps, z)
        rule(reason is not None, str(reason))
    q, k = p["sampling_rate"], cfg.clients
    sampling_ok = not call(lambda: ClientSampling(q, p["sampling"]))
    if "clip" in p:
        call(lambda: ClientDP(p["clip"], 0.0))  # σ is checked above
    fixed = sampling_ok and p["level"] == "client" and p["sampling"] == "fixed" and q < 1.0
    if fixed and k >= 1 and round(q * k) < 1:  # K < 1: data.clients's own error
        rule(
            True,
            f"privacy.sampling_rate = {q:g} with sampling 'fixed' draws round(q·K) = 0 of K = {k} clients "
            f"per round; set sampling_rate above {1 / (2 * k):.3g} (one client) or sampling = 'poisson'",
        )
    rule(
        p["pos_ratio"] is not None and not 0.0 < p["pos_ratio"] < 1.0,
        f"privacy.pos_ratio must lie in (0, 1), got {p['pos_ratio']}",
    )
    if bad_level:
        return errors
    stub, public = _algorithm_stub(cfg), (p["pos_ratio"] if p["pos_ratio"] is not None else cfg.imratio)
    if p["level"] == "client":
        reason = unsupported_reason(stub)
        rule(reason is not None, f"privacy.level = 'client': {reason}")
        rule(  # the pooled p (and the default lr) would depend on every site's counts
            stub.uses_pos_ratio and cfg.pos_ratio_mode == "global" and public is None,
            f"privacy.level = 'client': {cfg.algorithm}'s AUC loss needs a public class prior p, not one "
            "counted from every site's records; set privacy.pos_ratio (e.g. 0.1) or data.imratio",
        )
        rule(
            cfg.buffer_policy == "local",
            "privacy.level = 'client' with model.buffer_policy = 'local': the evaluated model would "
            "average the clients' BatchNorm statistics without noise; use buffer_policy 'average'",
        )
        return errors
    reason = unsupported_instance_reason(stub)
    rule(reason is not None, f"privacy.level = 'instance': {reason}")
    rule(
        stub.uses_pos_ratio and public is None,
        f"privacy.level = 'instance': {cfg.algorithm}'s AUC loss needs a public class prior p, not "
        "one counted from the records; set privacy.pos_ratio (e.g. 0.1) or data.imratio",
    )
    rule(q < 1.0, "privacy.sampling_rate < 1 is client sampling: it applies to level = 'client' only")
    rule(
        cfg.engine == "compile",
        "privacy.level = 'instance' runs on engines loop, vmap and distributed, not compile",
    )
    return errors
