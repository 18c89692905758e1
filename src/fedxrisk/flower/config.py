"""The run configuration of a Flower deployment (``[tool.flwr.app.config]`` of the app).

Flower run-config values are flat scalars with hyphenated keys; this module
turns them into a validated :class:`FlowerConfig` that the ServerApp and every
ClientApp build identically (same schedule, same model, same algorithm).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fedxrisk.algorithms import ALGORITHMS, Algorithm, Schedule
from fedxrisk.data import PARTITIONS
from fedxrisk.errors import ConfigError
from fedxrisk.flower.private import check_flower_privacy
from fedxrisk.flower.secure import check_secure_config
from fedxrisk.models import MODELS, build_model
from fedxrisk.problem import BUFFER_POLICIES, POS_RATIO_MODES, Problem
from fedxrisk.run.checks import MONITORS, SELECTIONS
from fedxrisk.run.spec import DEFAULT_LOCAL_STEPS


@dataclass
class FlowerConfig:
    """Run settings shared by the server and all sites (hyphenated in the app's pyproject)."""

    algorithm: str = "codasca"
    options: dict[str, Any] = field(default_factory=dict)  # JSON string in the run config
    model: str = "mlp"
    rounds: int = 10
    local_steps: int = 0  # 0: the algorithm's fixed window, else 8
    batch_size: int = 32
    lr: float = 0.0  # 0: the algorithm's default_lr
    stages: int = 1
    lr_decay: float = 3.0
    window_growth: float = 1.0
    seed: int = 0
    buffer_policy: str = "average"
    pos_ratio_mode: str = "global"
    positives_per_batch: int = 0  # > 0: class-aware batches for any algorithm (fedxrisk.classaware)
    allow_missing_class: bool = False
    eval_every: int = 1
    # federated validation (per-class score histograms summed on the server) and selection on it
    validation: float = 0.0  # trial sites: this fraction of each class of a site's part; 0: none
    selection: str = "last"  # model.pt: "last" or "best" (the best validation evaluation)
    monitor: str = ""  # the val_* column followed; "": the algorithm's
    early_stopping: int = 0  # stop after this many evaluations without improvement; 0: off
    init_from: str = ""  # a state dict / run folder at this path on the server and every site; "": none
    reset_head: bool = False  # re-initialise the classifier head after init-from (init_from.py)
    # trial sites (node config ``dataset`` + ``partition-id`` + ``num-partitions``)
    partition: str = "class"
    imratio: float = 0.1  # 0: keep the data's own ratio
    dirichlet_alpha: float = 0.5
    positive_classes: str = ""  # comma-separated class ids or names; "": the dataset's default
    # server side
    test_data: str = ""  # held-out file (npz/csv) or bundled dataset name; "": none
    out_dir: str = "fedxrisk-flower"
    min_nodes: int = 2
    node_wait_timeout: float = 300.0  # seconds to wait for min_nodes SuperNodes
    round_timeout: float = 600.0  # seconds one exchange may take before the run fails
    # client-level DP, noise added by the server (flower/private.py); privacy-clip = 0: off
    privacy_clip: float = 0.0
    privacy_noise_multiplier: float = 0.0
    privacy_target_epsilon: float = 0.0
    privacy_delta: float = 0.0  # 0: 1/N, N the sites' training samples
    privacy_noise_seed: int = -1  # -1: a secret the server draws
    privacy_sampling_rate: float = 1.0  # q: the fraction of sites per round (the server draws them)
    privacy_sampling: str = "poisson"  # or "fixed" (round(q·K) sites, without replacement)
    # a server optimizer on the mean of w (engines/server_opt.py); "": the plain mean
    server_optimizer: str = ""
    server_lr: float = 0.0  # 0: the optimizer's default
    server_beta1: float = 0.9
    server_beta2: float = 0.99
    server_tau: float = 1e-3
    secure_aggregation: bool = False  # every mean through Flower's SecAgg+ (flower/secure.py, secagg.py)
    secure_aggregation_range: float = 64.0  # R: values in [-R, R] are quantized; beyond stops the run

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FlowerConfig:
        """Parse Flower's flat run config; unknown keys are an error naming them."""
        known = {f.name.replace("_", "-"): f.name for f in fields(cls)}
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(f"unknown run-config key(s) {unknown}; allowed: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for key, value in run_config.items():
            name = known[key]
            if name == "options":
                try:
                    value = json.loads(value) if isinstance(value, str) else dict(value)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"run-config 'options' must be a JSON object: {e}") from e
                if not isinstance(value, dict):
                    raise ConfigError("run-config 'options' must be a JSON object")
            kwargs[name] = value
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    def build_model(self, input_shape: tuple[int, ...]) -> Any:
        """The model every party builds identically: seeded, then ``init-from`` loaded (strictly)."""
        from fedxrisk.run.weights import load_weights

        model = build_model(self.model, input_shape, self.seed)
        if self.init_from or self.reset_head:
            load_weights(model, self.model, self.init_from or None, self.reset_head)
        return model

    # -- resolved settings ---------------------------------------------------
    @property
    def algorithm_class(self) -> type[Algorithm]:
        return ALGORITHMS[self.algorithm]

    def resolved_local_steps(self) -> int:
        fixed = self.algorithm_class.fixed_window
        return self.local_steps or fixed or DEFAULT_LOCAL_STEPS

    def resolved_monitor(self) -> str:
        """The ``val_*`` column selection and early stopping follow (as ``RunConfig.resolved_monitor``)."""
        return self.monitor or self.algorithm_class.monitor

    def resolved_lr(self) -> float:
        return self.lr or self.algorithm_class.default_lr

    def schedule(self) -> Schedule:
        return Schedule.build(
            self.rounds, self.resolved_local_steps(), self.resolved_lr(), self.stages, self.lr_decay,
            self.window_growth,
        )  # fmt: skip

    def positive_class_ids(self) -> list[int | str] | None:
        """Comma-separated class ids or names (``lesion``, ``1``), or None for the dataset's default."""
        text = self.positive_classes.strip()
        if not text:
            return None
        items = [c.strip() for c in text.split(",")]
        if not all(items):
            raise ConfigError(f"positive-classes must be comma-separated class ids or names, got {text!r}")
        return [int(c) if c.lstrip("-").isdigit() else c for c in items]

    def imratio_or_none(self) -> float | None:
        return self.imratio or None

    def build_algorithm(self, problem: Problem) -> Algorithm:
        try:
            algorithm = self.algorithm_class(problem, **self.options)
            if not self.server_optimizer:
                return algorithm
            from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer

            opt = ServerOptimizer(self.server_optimizer, self.server_lr or None, self.server_beta1,
                                  self.server_beta2, self.server_tau)  # fmt: skip
            return with_server_optimizer(algorithm, opt)  # each site applies it to the server's mean
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{self.algorithm}: {e}") from e

    def validate(self) -> None:
        """Check every setting that needs no data (errors name the run-config key)."""
        for key, value, allowed in (
            ("algorithm", self.algorithm, ALGORITHMS),
            ("model", self.model, MODELS),
            ("buffer-policy", self.buffer_policy, BUFFER_POLICIES),
            ("pos-ratio-mode", self.pos_ratio_mode, POS_RATIO_MODES),
            ("partition", self.partition, PARTITIONS),
        ):
            if value not in allowed:
                raise ConfigError(f"unknown {key} {value!r}; choose one of {sorted(allowed)}")
        for key in ("rounds", "batch_size", "eval_every", "stages", "min_nodes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key.replace('_', '-')} must be ≥ 1, got {getattr(self, key)}")
        for key in ("local_steps", "lr", "imratio"):
            if getattr(self, key) < 0:
                raise ConfigError(
                    f"{key.replace('_', '-')} must be ≥ 0 (0: default), got {getattr(self, key)}"
                )
        if not self.imratio < 1:
            raise ConfigError(f"imratio must lie in (0, 1) (0: keep all samples), got {self.imratio}")
        if self.round_timeout <= 0 or self.node_wait_timeout <= 0:
            raise ConfigError("round-timeout and node-wait-timeout must be > 0 seconds")
        fixed = self.algorithm_class.fixed_window
        if fixed is not None and self.resolved_local_steps() != fixed:
            raise ConfigError(
                f"{self.algorithm} communicates every {fixed} step(s); set local-steps = {fixed}"
            )
        unknown = sorted(set(self.options) - set(self.algorithm_class.hyperparameters()))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {unknown} for {self.algorithm}; "
                f"allowed: {sorted(self.algorithm_class.hyperparameters())}"
            )
        positives = self.positives_per_batch or self.options.get(
            "positives_per_batch", self.algorithm_class.positives_per_batch
        )
        if isinstance(positives, int) and positives >= self.batch_size:
            raise ConfigError(
                f"{self.algorithm} draws positives_per_batch = {positives} positives per batch, which "
                f"leaves no negatives in batch-size = {self.batch_size}; raise batch-size or set "
                f'options = {{"positives_per_batch": ...}} below it'
            )
        self.positive_class_ids()
        self._validate_selection()
        check_flower_privacy(self)
        check_secure_config(self)
        try:
            self.schedule()
        except ValueError as e:
            raise ConfigError(str(e)) from e

    def _validate_selection(self) -> None:
        if not 0 <= self.validation < 1:
            raise ConfigError(f"validation must be 0 (none) or a fraction in (0, 1), got {self.validation}")
        if self.selection not in SELECTIONS:
            raise ConfigError(f"unknown selection {self.selection!r}; choose one of {list(SELECTIONS)}")
        if self.monitor and self.monitor not in MONITORS:
            raise ConfigError(f"unknown monitor {self.monitor!r}; choose one of {list(MONITORS)}")
        if self.early_stopping < 0:
            raise ConfigError(f"early-stopping must be ≥ 0 (0: off), got {self.early_stopping}")

    def is_eval_round(self, round_: int) -> bool:
        """Evaluate after round ``round_`` (0-based): every ``eval_every`` rounds and at the end."""
        return (round_ + 1) % self.eval_every == 0 or round_ + 1 == self.rounds


def default_run_config() -> dict[str, Any]:
    """The defaults as Flower run-config entries (what ``new-app`` writes to pyproject)."""
    out: dict[str, Any] = {}
    for f in fields(FlowerConfig):
        value = FlowerConfig().__getattribute__(f.name)
        out[f.name.replace("_", "-")] = json.dumps(value) if f.name == "options" else value
    return out
