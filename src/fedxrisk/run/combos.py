"""The rules of settings that meet each other: each ``rule(cfg)`` raises one :class:`ConfigError`
(one line: the settings, why, the way out) or returns. A combination that would run but silently do
nothing (or be refused only after the data is loaded) is refused here, at check time, so that
``fedxrisk check``, ``fedxrisk run`` and Flower's app writers refuse it alike (run/rules.py runs
these with the others). No torch.

:data:`NEEDS_DATA` names the checks that need facts only the data has; ``fedxrisk check`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fedxrisk.catalog import table
from fedxrisk.engines.server_rules import KEYS as SERVER_KEYS
from fedxrisk.engines.server_rules import value_error, wrap_reason
from fedxrisk.errors import ConfigError
from fedxrisk.run.configtypes import check_value, unknown_key
from fedxrisk.run.privacy import DEFAULTS as PRIVACY_DEFAULTS
from fedxrisk.run.spec import RunConfig

# The layers model.personal keeps per site, per registered model (tests/test_check_equals_run.py
# builds every model and compares): "bn": it has BatchNorm layers; "head": its classifier head is
# not the whole model (on ``linear`` the head IS the model: keeping it per site federates nothing).
MODEL_LAYERS: dict[str, dict[str, bool]] = {
    "linear": {"bn": False, "head": False},
    "mlp": {"bn": False, "head": True},
    "cnn": {"bn": True, "head": True},
    "cnn28": {"bn": False, "head": True},
    "cnn1d": {"bn": False, "head": True},
    "resnet20": {"bn": True, "head": True},
    "densenet121": {"bn": True, "head": True},
    "densenet121_imagenet": {"bn": True, "head": True},
    "densenet161": {"bn": True, "head": True},
}

# What only the data can tell: checked when a run (or a Flower site) loads it, not by `fedxrisk check`.
NEEDS_DATA = (
    "the model takes the data's input shape",
    "every client has both classes (data.allow_missing_class), enough samples for the split",
    "data.positives_per_batch needs a binary task (the data's label count)",
    "data.batch_size against the clients' shard sizes (capped at the largest, with a warning)",
    "under privacy with selection = 'best' or early stopping: the validation release against its noise",
)


def _server_keys(cfg: RunConfig) -> None:
    if cfg.server is not None and not isinstance(cfg.server, Mapping):
        raise ConfigError(f"[server] must be a table of keys, got {cfg.server!r}")
    unknown = sorted(set(cfg.server or ()) - set(SERVER_KEYS))
    if unknown:
        raise unknown_key(f"server.{unknown[0]}", SERVER_KEYS, "[server]")


def _server_value(key: str) -> Callable[[RunConfig], None]:
    def one(cfg: RunConfig) -> None:
        if not isinstance(cfg.server, Mapping) or key not in cfg.server:
            return
        value = check_value(f"server.{key}", cfg.server[key], SERVER_KEYS[key])  # a Flower run config's JSON
        reason = value_error(key, value)
        if reason is not None:
            raise ConfigError(reason)

    return one


def _server_algorithm(cfg: RunConfig) -> None:
    """A server optimizer needs a round that averages w (a stage restart: engines/server_opt.py)."""
    if cfg.server is None:
        return
    reason = wrap_reason(cfg.algorithm, table("algorithms")[cfg.algorithm]["communicates"])
    if reason is not None:
        raise ConfigError(
            f"[server] optimizer: {reason}; drop [server] or choose an algorithm that averages w"
        )


def _personal_model(cfg: RunConfig) -> None:
    layers = MODEL_LAYERS.get(cfg.model)
    if cfg.personal not in ("bn", "head") or layers is None or layers[cfg.personal]:
        return
    if cfg.personal == "bn":
        with_bn = sorted(m for m, lay in MODEL_LAYERS.items() if lay["bn"])
        other = "'head' or 'none'" if layers["head"] else "'none'"
        raise ConfigError(
            f"model.personal = 'bn': the model {cfg.model!r} has no BatchNorm layer; use personal = {other}, "
            f"or a model with BatchNorm ({', '.join(with_bn)})"
        )
    raise ConfigError(
        f"model.personal = 'head' on model {cfg.model!r}: its classifier head is the whole model, so "
        "keeping it per site federates nothing; use personal = 'none', or a model with a body (e.g. mlp)"
    )


def _instance_batchnorm(cfg: RunConfig) -> None:
    """Instance-level DP clips per-sample gradients; BatchNorm's batch statistics couple the samples
    (engines/privacy/instance.py refused it only once the model was built: `check` said ok)."""
    level = cfg.privacy.get("level", "client") if isinstance(cfg.privacy, Mapping) else None
    if level == "instance" and MODEL_LAYERS.get(cfg.model, {}).get("bn"):
        without = sorted(m for m, lay in MODEL_LAYERS.items() if not lay["bn"])
        raise ConfigError(
            f"privacy.level = 'instance' with model {cfg.model!r}: its BatchNorm statistics couple samples, "
            f"which per-sample clipping does not cover; use a model without BatchNorm ({', '.join(without)})"
        )


def _positives(cfg: RunConfig) -> None:
    """Class-aware batches (classaware.class_aware_batches): P in [1, B − 1], not with local p."""
    positives = cfg.resolved_positives()
    if not positives:
        return
    if not 1 <= positives < cfg.batch_size:
        raise ConfigError(
            f"positives_per_batch must lie in [1, batch_size − 1] = [1, {cfg.batch_size - 1}], got {positives}"
        )
    if cfg.pos_ratio_mode == "local":
        raise ConfigError(
            "pos_ratio_mode 'local' contradicts class-aware batches (positives_per_batch > 0), "
            "whose AUC losses use p = positives_per_batch / batch_size; use 'global' or 'batch'"
        )


VALIDATION_KEYS = ("validation_noise_multiplier", "validation_bins")  # of the validation releases


def _validation_release(cfg: RunConfig) -> None:
    """``privacy.validation_*`` shape the validation releases, which only selection/early stopping make."""
    if not isinstance(cfg.privacy, Mapping) or cfg.selection == "best" or cfg.early_stopping:
        return
    set_keys = [k for k in VALIDATION_KEYS if k in cfg.privacy and cfg.privacy[k] != PRIVACY_DEFAULTS[k]]
    if set_keys:
        raise ConfigError(
            f"privacy.{set_keys[0]} is set but nothing releases validation numbers: it applies with "
            "experiment.selection = 'best' or experiment.early_stopping (and data.validation); set one or drop the key"
        )


def _task(cfg: RunConfig) -> None:
    """An algorithm trains on its task's data: survival algorithms (an event flag with a time) on the
    survival datasets, the others on binary labels; survival runs in process only (no histogram
    validation, no DP accounting of its pools, no Flower app yet)."""
    survival = cfg.dataset in table("survival_datasets")
    task = table("algorithms")[cfg.algorithm].get("task", "binary")
    if survival and task != "survival":
        raise ConfigError(
            f"dataset {cfg.dataset!r} is survival data (an event flag with a time) but {cfg.algorithm!r} "
            "trains on binary labels; choose a survival algorithm: fedavg_cox, fedxl2_cox or fedxl1_cindex"
        )
    if task == "survival" and not survival:
        raise ConfigError(
            f"{cfg.algorithm!r} is a survival algorithm (Cox, C-index: an event flag with a time), but dataset "
            f"{cfg.dataset!r} has binary labels; choose a survival dataset ({', '.join(table('survival_datasets'))})"
        )
    if cfg.monitor is not None and (cfg.monitor == "val_cindex") != survival:
        want = "val_cindex (survival data)" if survival else "a binary metric (val_auroc, val_ap, …)"
        raise ConfigError(f"experiment.monitor = {cfg.monitor!r} on {cfg.dataset!r}: use {want} or drop it")
    if survival and cfg.privacy is not None and (cfg.selection == "best" or cfg.early_stopping):
        raise ConfigError(
            "[privacy] with experiment.selection = 'best' or early stopping on survival data: the private "
            "validation release is of AUROC histograms, not the C-index; use selection = 'last' without early stopping"
        )
    if survival and cfg.personal != "none":
        raise ConfigError(
            f"model.personal = {cfg.personal!r} on survival data: the per-site models are scored by AUROC, "
            "not the C-index; use personal = 'none'"
        )
    if survival and cfg.engine == "distributed":
        raise ConfigError(
            "engine = 'distributed' on survival data: its validation C-index is not computed across "
            "ranks; use engine = 'loop' or 'vmap'"
        )


def _local_steps(cfg: RunConfig) -> None:
    if isinstance(cfg.local_steps, int) and cfg.local_steps < 1:
        raise ConfigError(f"local_steps must be ≥ 1, got {cfg.local_steps}")


PARTICIPATION = ("uniform", "weighted")


def _participation(cfg: RunConfig) -> None:
    """``data.clients_per_round`` (a count in [1, K] or a fraction in (0, 1]), ``data.participation``
    and ``data.participation_seed``; client-level DP draws its participants itself (privacy.sampling_rate)."""
    m = cfg.clients_per_round
    if cfg.participation not in PARTICIPATION:
        raise ConfigError(
            f"participation must be one of {', '.join(PARTICIPATION)}, got {cfg.participation!r}"
        )
    if isinstance(cfg.participation_seed, int) and cfg.participation_seed < 0:
        raise ConfigError(
            f"participation_seed must be ≥ 0 (none: the run seed), got {cfg.participation_seed}"
        )
    if m is None:
        return
    if isinstance(m, int) and m < 1:
        raise ConfigError(f"clients_per_round must be ≥ 1 (none: every client), got {m}")
    if isinstance(m, int) and isinstance(cfg.clients, int) and m > cfg.clients:
        raise ConfigError(
            f"clients_per_round = {m} exceeds the {cfg.clients} clients (data.clients; on Flower set it to the "
            f"number of sites); set at most {cfg.clients}"
        )
    if isinstance(m, float) and not 0.0 < m <= 1.0:
        raise ConfigError(
            f"clients_per_round = {m}: a fraction must lie in (0, 1] (a count is an integer); none: every client"
        )
    if cfg.privacy is not None:
        raise ConfigError(
            "data.clients_per_round with [privacy]: DP draws each round's clients itself from its secret "
            "source; drop clients_per_round and set privacy.sampling_rate"
        )


CHECKS: tuple[Callable[[RunConfig], None], ...] = (
    _participation, _local_steps, _server_keys, *(_server_value(k) for k in SERVER_KEYS), _personal_model, _validation_release,
    _instance_batchnorm,
)  # fmt: skip
ALGORITHM_CHECKS: tuple[Callable[[RunConfig], None], ...] = (_task, _positives, _server_algorithm)
