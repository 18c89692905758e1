"""The config tables of their own, ``[pretrain]`` and ``[server]``, read with every error collected.

Like the main sections (:func:`fedxrisk.run.configfile.read_sections`), a table's unknown keys and
wrongly typed values are all reported at once, and a wrong value keeps its default so that the range
checks (:mod:`fedxrisk.run.checks`) still run on the rest. ``[privacy]``'s reader is
:func:`fedxrisk.run.privacy.privacy_table`, which collects the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedxrisk.engines.server_rules import KEYS as SERVER_KEYS
from fedxrisk.errors import ConfigError, first_error
from fedxrisk.run.configtypes import check_value, hyperparameter_types, unknown_key
from fedxrisk.run.spec import settings
from fedxrisk.run.stage import PRETRAIN_ALGORITHM, STAGE_KEYS, check_stage_algorithm, stage_algorithm


def server_from_table(table: Any) -> dict[str, Any]:
    """Type-check a ``[server]`` table (its values: run/combos.py); the first error raised."""
    return first_error(server_table, table)


def pretrain_from_table(table: Any) -> dict[str, Any]:
    """Type-check a ``[pretrain]`` table (stage keys plus the algorithm's hyperparameters); the first
    error raised."""
    return first_error(pretrain_table, table)


def server_table(table: Any, errors: list[ConfigError]) -> dict[str, Any]:
    """The ``[server]`` keys that are known and well typed; every other key's error appended."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"[server] must be a table of keys, got {table!r}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in SERVER_KEYS:
            errors.append(unknown_key(f"server.{key}", list(SERVER_KEYS), "[server]"))
            continue
        try:
            out[key] = check_value(f"server.{key}", value, SERVER_KEYS[key])
        except ConfigError as e:
            errors.append(e)
    return out


def pretrain_table(table: Any, errors: list[ConfigError]) -> dict[str, Any]:
    """The ``[pretrain]`` keys that are known and well typed; every other key's error appended. With
    an unknown ``pretrain.algorithm`` only the stage keys are read (its hyperparameters are unknown)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"[pretrain] must be a table of keys, got {table!r}")
    name = table.get("algorithm", PRETRAIN_ALGORITHM)
    try:
        check_stage_algorithm(name)
        hparams = hyperparameter_types(stage_algorithm(name))
    except ConfigError as e:
        errors.append(e)
        name, hparams = None, None
    fields = {s.name: s.hint for s in settings().values()}
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key == "algorithm" and name is None:
            continue  # reported above
        hint = fields[key] if key in STAGE_KEYS else (hparams or {}).get(key)
        if hint is None:
            if hparams is not None:
                where = f"[pretrain] with algorithm = {name!r}"
                errors.append(unknown_key(f"pretrain.{key}", [*STAGE_KEYS, *hparams], where))
            continue
        try:
            out[key] = check_value(f"pretrain.{key}", value, hint)
        except ConfigError as e:
            errors.append(e)
    return out
