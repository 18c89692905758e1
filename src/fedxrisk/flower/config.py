"""Flower's run config (``[tool.flwr.app.config]``): a flat view of :class:`RunConfig`, not a schema.

Flower run-config values are flat scalars with hyphenated keys. :func:`to_flat` writes every
field of :class:`~fedxrisk.run.spec.RunConfig` (``dataclasses.fields``) under its hyphenated
name (``local_steps`` → ``local-steps``); a dict or list becomes JSON text and None the string
``"none"``, as in a config file. :func:`from_flat` reads it back, type-checks each value against
``RunConfig``'s hints and runs the run layer's own :func:`~fedxrisk.run.checks.check`, so a
Flower run and ``fedxrisk run`` have the same defaults and refusals by construction (rounds,
stages, ``eval_every``; ``lr`` resolved from the data by the one assembly, :func:`~fedxrisk.run.assemble.assemble`).

What only a deployment has (the server's test data and output folder, how many nodes to wait
for and how long, secure aggregation) is a :class:`Deployment`, which holds no run setting.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedxrisk.algorithms import ALGORITHMS, Algorithm
from fedxrisk.errors import ConfigError
from fedxrisk.run.assemble import Assembly, Facts, assemble, assemble_model
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


# Settings of how the simulation makes its data or runs its engine, which no Flower party honours:
# set to anything but their default, they are refused (never accepted and ignored). name → (what it
# does in `fedxrisk run`, the way out on Flower).
NOT_HONOURED: dict[str, tuple[str, str]] = {
    "feature_shift": ("shifts the simulated clients' features", "drop it: each site trains on its own data"),
    "num_samples": ("subsamples the simulated dataset", "drop it: each site trains on all its data"),
    "test_imratio": (
        "resamples the simulated test split",
        "drop it: the server's test-data is used as given",
    ),
    "image_size": ("resizes images as the simulation reads them", "drop it and resize the sites' files"),
    "augment": (
        "augments the simulation's training images",
        "drop it: sites train on their data unaugmented",
    ),
    "normalize": ("normalizes the inputs inside the model", "drop it and normalize the sites' files"),
    "memory_budget": (
        "sizes the simulation's streaming and evaluation chunks",
        "drop it (node config stream)",
    ),
    "engine": (
        "chooses how one process runs the clients",
        'drop it or set "loop": each site runs its client',
    ),
    "sources": (
        "trains the simulation on some of its sites only",
        "drop it: start SuperNodes for the sites that should train",
    ),
    "on_missing": (
        "handles a CSV's missing cells as the simulation reads it",
        "drop it and give the sites files without missing values",
    ),
    "pretrain": (
        "trains a first stage before the run",
        "run the first stage with `fedxrisk run` and start the Flower run from its model.pt (init-from)",
    ),
}
SITE_ENGINES = ("loop", "vmap")  # one client per site: loop and vmap run it identically


def check_honoured(run: RunConfig) -> None:
    """One-line :class:`ConfigError` for a setting set that a Flower deployment does not honour."""
    from fedxrisk.catalog import algorithm, table

    if (
        run.dataset in table("survival_datasets")
        or (algorithm(run.algorithm) or {}).get("task") == "survival"
    ):
        raise ConfigError(
            f"run-config dataset {run.dataset!r} / algorithm {run.algorithm!r} is a survival run, which a Flower "
            "deployment does not honour (its sites report AUROC histograms, not C-index pairs); run it with "
            "`fedxrisk run` (docs/survival.md)"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in NOT_HONOURED}
    for name, (what, way_out) in NOT_HONOURED.items():
        value = getattr(run, name)
        if value == defaults[name] or (name == "engine" and value in SITE_ENGINES):
            continue
        raise ConfigError(
            f"run-config {_key(name)!r} = {flat_value(value)!r} {what}, which a Flower deployment does not "
            f"honour; {way_out}"
        )


def site_facts(input_shape: tuple[int, ...], pos_ratio: float, num_clients: int, max_samples: int) -> Facts:
    """What a Flower site knows at set-up (the server's first step message): no other site's counts,
    so no privacy plan (the server clips and adds the noise)."""
    return Facts(tuple(input_shape), 1, pos_ratio, num_clients, max_samples)


def _key(name: str) -> str:
    return name.replace("_", "-")


@functools.cache  # read for every run config (the support matrix checks ~1,000)
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

    def build_model(self, input_shape: tuple[int, ...]) -> Any:
        """The model every party builds identically: ``model_fn``'s or the run's
        (:func:`~fedxrisk.run.assemble.assemble_model`), then ``init-from`` loaded (strictly)."""
        from fedxrisk.run.weights import load_weights

        run = self.run
        if self.model_fn is not None:
            return self.model_fn(input_shape)
        model = assemble_model(run, site_facts(input_shape, math.nan, 1, 1))
        if run.init_from or run.reset_head:
            load_weights(model, run.model, run.init_from or None, run.reset_head)
        return model

    def assemble(self, facts: Facts) -> Assembly:
        """The run's parts on a party knowing ``facts`` (:func:`~fedxrisk.run.assemble.assemble`, as
        ``fedxrisk run`` builds them); a party's own data never enters."""
        with warnings.catch_warnings():  # the step size from the data: the coordinator logs it once
            warnings.simplefilter("ignore")
            return assemble(self.run, facts, self.build_model(facts.input_shape))

    def validate(self) -> None:
        """The run layer's checks, then what a Flower deployment adds (errors name run-config keys)."""
        from fedxrisk.flower.personal import check_flower_personal
        from fedxrisk.flower.private import check_flower_privacy
        from fedxrisk.flower.secure import check_secure_config

        run, deploy = self.run, self.deploy
        check_honoured(run)  # first: on Flower, such a setting is refused whatever its value
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
        check_flower_participation(run, deploy.secure_aggregation)


def check_flower_participation(run: RunConfig, secure: bool) -> None:
    """``clients-per-round`` on Flower: the server draws the sites of each round among the connected
    nodes; refused (one line) with SecAgg+ (its sum runs over every site) and for algorithms that pool
    per-sample records (a site sitting a round out cannot send records of the participants' shape)."""
    if run.clients_per_round is None:
        return
    from fedxrisk.algorithms import ALGORITHMS

    if secure:
        raise ConfigError(
            "run-config 'clients-per-round' with secure-aggregation: SecAgg+'s sum runs over every site; "
            "drop one of the two"
        )
    if "pool" in ALGORITHMS[run.algorithm].collectives:
        raise ConfigError(
            f"run-config 'clients-per-round' with {run.algorithm}: its per-sample score pools need every "
            "site each round on Flower; drop clients-per-round (the simulation engines honour it)"
        )


def _flat_names(message: str) -> str:
    """``message`` with RunConfig field names as run-config keys (not inside ``privacy.*`` etc.)."""
    sections = "|".join(SECTION_ORDER)  # the run layer qualifies a setting with its section
    for name in (f.name for f in dataclasses.fields(RunConfig)):
        message = re.sub(rf"(?<![\w.])(?:(?:{sections})\.)?{name}(?!\w)", _key(name), message)
    return message


def default_run_config() -> dict[str, Any]:
    """The defaults as Flower run-config entries (what ``new-app`` writes to pyproject)."""
    return to_flat(RunConfig())
