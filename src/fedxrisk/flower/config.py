"""Flower's run config (``[tool.flwr.app.config]``): a flat view of :class:`RunConfig`, not a schema.

Flower run-config values are flat scalars with hyphenated keys. :func:`to_flat` writes every
field of :class:`~fedxrisk.run.spec.RunConfig` (``dataclasses.fields``) under its hyphenated
name (``local_steps`` → ``local-steps``); a dict or list becomes JSON text and None the string
``"none"``, as in a config file. :func:`from_flat` reads it back, type-checks each value against
``RunConfig``'s hints and runs the run layer's own :func:`~fedxrisk.run.checks.check`, so a
Flower run and ``fedxrisk run`` have the same defaults and refusals by construction (rounds,
stages, ``eval_every``; ``lr`` resolved from the data by :func:`~fedxrisk.run.build.with_data_lr`).

What only a deployment has (the server's test data and output folder, how many nodes to wait
for and how long, secure aggregation) is a :class:`Deployment`, which holds no run setting.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedxrisk.algorithms import ALGORITHMS, Algorithm, Schedule
from fedxrisk.errors import ConfigError
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from fedxrisk.run.checks import checked
from fedxrisk.run.configtypes import NONE, check_value
from fedxrisk.run.privacy import privacy_from_table
from fedxrisk.run.spec import SECTION_ORDER, RunConfig

ModelFn = Callable[[tuple[int, ...]], Any]  # input shape → an nn.Module (any model, not only registered)


@dataclass(frozen=True)
class Deployment:
    """Settings of a Flower deployment that ``fedxrisk run`` has no use for."""

    test_data: str = ""  # the server's held-out file (npz/csv) or a bundled dataset's name; "": none
    out_dir: str = "fedxrisk-flower"
    min_nodes: int = 2
    node_wait_timeout: float = 300.0  # seconds to wait for min-nodes SuperNodes
    round_timeout: float = 600.0  # seconds one exchange may take before the run fails
    secure_aggregation: bool = False  # every mean through Flower's SecAgg+ (secure.py, secagg.py)
    secure_aggregation_range: float = 64.0  # R: values in [-R, R] are quantized; beyond stops the run


def _key(name: str) -> str:
    return name.replace("_", "-")


def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def flat_value(value: Any) -> Any:
    """One run-config value as Flower takes it: None → "none", a dict or list → JSON text."""
    if value is None:
        return NONE
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return value


def to_flat(cfg: RunConfig, deploy: Deployment | None = None) -> dict[str, Any]:
    """Every field of ``cfg`` (then of ``deploy``) as a flat Flower run-config entry."""
    out = {_key(f.name): flat_value(getattr(cfg, f.name)) for f in dataclasses.fields(RunConfig)}
    deploy = deploy or Deployment()
    return out | {_key(f.name): getattr(deploy, f.name) for f in dataclasses.fields(Deployment)}


def _parse(key: str, value: Any, hint: Any) -> Any:
    """A flat value for a field of type ``hint``: JSON text for dicts and lists, then the type check."""
    text = value.strip() if isinstance(value, str) else None
    if text and text[0] in "[{" and any(t in str(hint) for t in ("dict", "list", "Any")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"run-config {key!r} must be JSON: {e}") from None
    elif text is not None and "str" not in str(hint):  # `flwr run --run-config` may pass text
        value = _scalar(text, hint)
    return check_value(f"run-config {key!r}", value, hint)


def _scalar(text: str, hint: Any) -> Any:
    """``"true"``/``"false"`` as a bool, a number's text as the number (``"nan"`` too, so that its
    range check names it); anything else unchanged, for the type check to name."""
    if hint is bool and text.lower() in ("true", "false"):
        return text.lower() == "true"
    kinds = str(hint)
    for kind in (int, float):
        if kind.__name__ in kinds:
            try:
                return kind(text)
            except ValueError:
                continue
    return text


def from_flat(mapping: Mapping[str, Any]) -> FlowerConfig:
    """Flower's flat run config → a checked :class:`FlowerConfig`; an unknown key is an error."""
    run_hints, deploy_hints = _hints(RunConfig), _hints(Deployment)
    run: dict[str, Any] = {}
    deploy: dict[str, Any] = {}
    for key, value in mapping.items():
        name = key.replace("-", "_")
        if name in run_hints:
            run[name] = _parse(key, value, run_hints[name])
        elif name in deploy_hints:
            deploy[name] = _parse(key, value, deploy_hints[name])
        else:
            allowed = sorted(map(_key, (*run_hints, *deploy_hints)))
            raise ConfigError(f"unknown run-config key {key!r}; allowed: {', '.join(allowed)}")
    if "options" in run and not isinstance(run["options"], dict):
        raise ConfigError("run-config 'options' must be a JSON object")
    if run.get("privacy") is not None:
        run["privacy"] = privacy_from_table(run["privacy"])
    cfg = FlowerConfig(RunConfig(**run), Deployment(**deploy))
    cfg.validate()
    return cfg


@dataclass(frozen=True)
class FlowerConfig:
    """A run (:class:`RunConfig`) and where it is deployed (:class:`Deployment`)."""

    run: RunConfig = field(default_factory=RunConfig)
    deploy: Deployment = field(default_factory=Deployment)
    # any nn.Module: input shape → the model (the same on the server and every site); None: run.model
    model_fn: ModelFn | None = field(default=None, compare=False)

    from_run_config = staticmethod(from_flat)  # the name the apps and tests call

    @property
    def algorithm_class(self) -> type[Algorithm]:
        return ALGORITHMS[self.run.algorithm]

    @property
    def privacy(self) -> dict[str, Any] | None:
        """The ``[privacy]`` table with every key filled, or None (no DP)."""
        return None if self.run.privacy is None else privacy_from_table(self.run.privacy)

    @property
    def private_reports(self) -> bool:
        """Under DP or SecAgg+ a site sends no loss, no AUROC and no validation count in clear."""
        return self.run.privacy is not None or self.deploy.secure_aggregation

    def resolved(self, pos_ratio: float) -> RunConfig:
        """The run with its step size fixed for the federation's positive ratio, as ``build`` fixes it
        (every party computes it from the same set-up counts)."""
        from fedxrisk.run.build import with_data_lr

        with warnings.catch_warnings():  # the server logs it once (coordinator)
            warnings.simplefilter("ignore")
            return with_data_lr(self.run, pos_ratio)

    def schedule(self, pos_ratio: float) -> Schedule:
        """``fedxrisk run``'s schedule (run/rules.schedule) of the run resolved for ``pos_ratio``."""
        from fedxrisk.run.rules import schedule

        return schedule(self.resolved(pos_ratio))

    def build_model(self, input_shape: tuple[int, ...]) -> Any:
        """The model every party builds identically: ``model_fn``'s or the registered ``model`` (seeded),
        then ``init-from`` loaded (strictly)."""
        from fedxrisk.run.weights import load_weights

        run = self.run
        if self.model_fn is not None:
            return self.model_fn(input_shape)
        model = build_model(run.model, input_shape, run.seed)
        if run.init_from or run.reset_head:
            load_weights(model, run.model, run.init_from or None, run.reset_head)
        return model

    def build_algorithm(self, problem: Problem) -> Algorithm:
        try:
            algorithm = self.algorithm_class(problem, **self.run.options)
            if self.run.server is None:
                return algorithm
            from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer

            return with_server_optimizer(algorithm, ServerOptimizer(**self.run.server))  # each site steps it
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{self.run.algorithm}: {e}") from e

    def validate(self) -> None:
        """The run layer's checks, then what a Flower deployment adds (errors name run-config keys)."""
        from fedxrisk.flower.personal import check_flower_personal
        from fedxrisk.flower.private import check_flower_privacy
        from fedxrisk.flower.secure import check_secure_config

        run, deploy = self.run, self.deploy
        try:
            checked(run)
        except ConfigError as e:  # name the run-config key, e.g. early-stopping for early_stopping
            raise ConfigError(_flat_names(str(e))) from None
        if deploy.min_nodes < 1:
            raise ConfigError(f"min-nodes must be ≥ 1, got {deploy.min_nodes}")
        for key, value in (
            ("round-timeout", deploy.round_timeout),
            ("node-wait-timeout", deploy.node_wait_timeout),
        ):
            if not 0 < value < float("inf"):  # NaN too: a wait that never ends, or none at all
                raise ConfigError(f"{key} must be a finite number of seconds > 0, got {value}")
        check_flower_personal(
            run
        )  # data.positives_per_batch vs batch-size: the run layer's rule (run/combos.py)
        check_flower_privacy(self)
        check_secure_config(self)


def _flat_names(message: str) -> str:
    """``message`` with RunConfig field names as run-config keys (not inside ``privacy.*`` etc.)."""
    sections = "|".join(SECTION_ORDER)  # the run layer qualifies a setting with its section
    for name in (f.name for f in dataclasses.fields(RunConfig)):
        message = re.sub(rf"(?<![\w.])(?:(?:{sections})\.)?{name}(?!\w)", _key(name), message)
    return message


def default_run_config() -> dict[str, Any]:
    """The defaults as Flower run-config entries (what ``new-app`` writes to pyproject)."""
    return to_flat(RunConfig())
