"""Experiment configs as TOML: sections ↔ :class:`~fedxrisk.run.spec.RunConfig`, validated up front.

A config file has the tables ``[experiment]``, ``[data]``, ``[model]``, ``[algorithm]`` (which
also takes the algorithm's own hyperparameters, see ``fedxrisk list``) and ``[engine]``; which key
goes in which is declared on :class:`RunConfig`'s fields (``section``, run/spec.py) and
:data:`SECTIONS` is read from them. ``[pretrain]`` is an optional first stage
(:mod:`fedxrisk.run.recipes`), ``[privacy]`` optional differential privacy
(:mod:`fedxrisk.run.privacy`). Every key is optional (missing keys keep the defaults).

TOML has no null: the string ``"none"`` sets a key that accepts None (e.g.
``imratio = "none"`` keeps the dataset's own class ratio). ``summary.json``
(its flat ``config`` object) is accepted wherever a config file is.

Every error is a :class:`~fedxrisk.errors.ConfigError` with one message that names the key
(``section.key``) and what is allowed; :func:`read_sections` collects all of them,
:func:`config_from_sections` raises them (:class:`~fedxrisk.errors.ConfigErrors`).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fedxrisk import catalog
from fedxrisk.errors import ConfigError, raise_all
from fedxrisk.run import checks
from fedxrisk.run.configtypes import MISMATCH, NONE, check_value, coerce, hyperparameter_types, unknown_key
from fedxrisk.run.names import resolve
from fedxrisk.run.nested import (  # noqa: F401  (re-exported)
    SERVER_KEYS,
    pretrain_from_table,
    pretrain_table,
    server_from_table,
    server_table,
)
from fedxrisk.run.privacy import DEFAULTS as PRIVACY_DEFAULTS
from fedxrisk.run.privacy import privacy_table
from fedxrisk.run.spec import (
    SECTION_ORDER,
    RunConfig,
    settings,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Each section's keys, in RunConfig's field order: read from the fields' ``section`` (run/spec.py).
SECTIONS: dict[str, tuple[str, ...]] = {
    section: tuple(s.name for s in settings().values() if s.section == section) for section in SECTION_ORDER
}
PRETRAIN = "pretrain"  # the optional first stage's section (RunConfig.pretrain, fedxrisk.run.recipes)
PRIVACY, SERVER = "privacy", "server"
NESTED = (PRETRAIN, PRIVACY, SERVER)  # sections kept as one dict field of RunConfig


def non_default(cfg: RunConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that differ from their defaults (``fedxrisk check`` prints them)."""
    return {n: getattr(cfg, n) for n, s in settings().items() if getattr(cfg, n) != s.default}


def _fields() -> dict[str, Any]:
    """RunConfig field name → type hint, for the fields a section holds (``options`` excluded)."""
    return {s.name: s.hint for s in settings().values() if s.section is not None}


def section_keys(section: str) -> tuple[str, ...]:
    """The RunConfig fields a section holds (``[algorithm]`` also takes hyperparameters)."""
    return SECTIONS[section]


def section_of(key: str) -> str:
    for section in SECTIONS:
        if key in section_keys(section):
            return section
    raise KeyError(f"RunConfig field {key!r} has no config section; give it one in run/spec.py")


# -- sections ↔ RunConfig ------------------------------------------------------
def config_from_sections(doc: Mapping[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from a sectioned dict (a parsed TOML file); its error raised,
    or a :class:`~fedxrisk.errors.ConfigErrors` holding every one (the CLI prints a line each)."""
    cfg, errors = read_sections(doc)
    raise_all(errors)
    return cfg


def read_sections(doc: Mapping[str, Any], thorough: bool = False) -> tuple[RunConfig, list[ConfigError]]:
    """The RunConfig a sectioned dict describes and every error in it: unknown keys, wrong types
    (such a value keeps its default), then :func:`~fedxrisk.run.checks.check` of the rest."""
    values: dict[str, Any] = {}
    errors: list[ConfigError] = []
    fields = _fields()

    def collect(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ConfigError as e:
            errors.append(e)
            return MISMATCH

    for section, table in doc.items():
        if section in NESTED and table is not None:  # every unknown key and wrong type at once
            read = {PRETRAIN: pretrain_table, PRIVACY: privacy_table, SERVER: server_table}[section]
            value = collect(lambda r=read, t=table: r(t, errors))
            if value is not MISMATCH:  # the well-typed keys, checked with the rest
                values[section] = value
        elif section not in SECTIONS:
            collect(lambda s=section: _unknown_section(s, fields))
        elif not isinstance(table, Mapping):
            errors.append(ConfigError(f"[{section}] must be a table of keys, got {table!r}"))
        else:
            for key, value in table.items():
                if key in section_keys(section):
                    out = collect(lambda k=key, v=value, s=section: check_value(f"{s}.{k}", v, fields[k]))
                    if out is not MISMATCH:
                        values[key] = out
                elif section != "algorithm":
                    errors.append(unknown_key(f"{section}.{key}", section_keys(section), f"[{section}]"))
    rounds = values.get("rounds", RunConfig.rounds)
    if "stages" not in values and 1 <= rounds < RunConfig.stages:  # --rounds 2: one stage per round
        values["stages"] = rounds
    algorithm = collect(  # "CODA+" → codaplus: the key is what gets recorded
        lambda: resolve(
            values.get("algorithm", RunConfig.algorithm), catalog.table("algorithms"), "algorithm.algorithm"
        )
    )
    options: dict[str, Any] = {}
    if algorithm is not MISMATCH:
        values["algorithm"] = algorithm
        options = _options(algorithm, doc.get("algorithm", {}), collect, errors)
    cfg = RunConfig(**values, options=options)
    seen = {str(e) for e in errors}
    for e in checks.check(cfg, thorough):
        unknown_algorithm = algorithm is MISMATCH and str(e).startswith("unknown algorithm")
        if str(e) not in seen and not unknown_algorithm:  # resolve() said it, with a "did you mean"
            errors.append(e)
    return cfg, errors


def _options(algorithm: str, table: Any, collect: Callable[..., Any], errors: list[ConfigError]) -> dict:
    """The algorithm's hyperparameters of an ``[algorithm]`` table, type-checked; errors collected."""
    options: dict[str, Any] = {}
    hparams = hyperparameter_types(algorithm)
    for key, value in table.items() if isinstance(table, Mapping) else ():
        if key in section_keys("algorithm"):
            continue
        if key not in hparams:
            allowed = [*section_keys("algorithm"), *hparams]
            errors.append(
                unknown_key(f"algorithm.{key}", allowed, f"[algorithm] with algorithm = {algorithm!r}")
            )
            continue
        out = collect(lambda k=key, v=value: check_value(f"algorithm.{k}", v, hparams[k]))
        if out is not MISMATCH:
            options[key] = out
    return options


def _unknown_section(section: str, fields: Mapping[str, Any]) -> None:
    if section in fields:
        raise ConfigError(
            f"{section!r} belongs in [{section_of(section)}], as {section_of(section)}.{section}"
        )
    raise unknown_key(section, SECTIONS, "a config file")


def config_to_sections(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """The sectioned form of ``cfg`` with ``lr`` and ``local_steps`` resolved."""
    flat = cfg.to_dict()
    doc = {section: {k: flat[k] for k in section_keys(section) if k in flat} for section in SECTIONS}
    doc["algorithm"].update(cfg.options)
    if cfg.pretrain is not None:
        doc[PRETRAIN] = dict(cfg.pretrain)
    if cfg.privacy is not None:
        doc[PRIVACY] = dict(cfg.privacy)
    if cfg.server is not None:
        doc[SERVER] = dict(cfg.server)
    return doc


def sections_from_flat(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat dict (``summary.json``'s ``config``) → sections; unknown keys are reported."""
    doc: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if key == "options":
            if not isinstance(value, Mapping):
                raise ConfigError(f"config.options must be a table, got {value!r}")
            doc.setdefault("algorithm", {}).update(value)
            continue
        if key in NESTED:
            if value is not None:
                doc[key] = value
            continue
        try:
            doc.setdefault(section_of(key), {})[key] = value
        except KeyError:
            raise unknown_key(key, _fields(), "a flat config") from None
    return doc


def flat_unchecked(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``config.toml`` as the flat dict ``RunConfig.to_dict()`` gives, NOT validated:
    reading a run folder (``fedxrisk plot``) must not depend on this machine (CUDA, torchrun's
    variables of a distributed run)."""
    fields, flat, options = _fields(), {}, {}
    for section, table in doc.items():
        for key, value in (table if isinstance(table, Mapping) else {}).items():
            if key in fields:
                coerced = coerce(value, fields[key])
                flat[key] = value if coerced is MISMATCH else coerced
            elif section == "algorithm":
                options[key] = value
    return {**flat, "options": options}


def config_from_flat(flat: Mapping[str, Any]) -> RunConfig:
    return config_from_sections(sections_from_flat(flat))


# -- files ---------------------------------------------------------------------
def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML config, or a ``summary.json`` / JSON config, as a sectioned dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"
        ) from None
    if path.suffix == ".json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from e
        if isinstance(obj, dict) and isinstance(obj.get("config"), dict):
            obj = obj["config"]  # a summary.json
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        return obj if set(obj) <= {*SECTIONS, *NESTED} else sections_from_flat(obj)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from e


def parse_value(raw: str) -> Any:
    """A command-line value: a TOML value (``0.05``, ``true``, ``[1, 3]``, ``"x"``), else the text."""
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(doc: dict[str, Any], assignment: str) -> None:
    """Apply ``section.key=value`` to a sectioned dict (checked later, with the rest)."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects SECTION.KEY=VALUE, got {assignment!r}")
    name, raw = assignment.split("=", 1)
    section, dot, key = name.strip().partition(".")
    if not dot or not key:
        raise ConfigError(
            f"--set {name.strip()!r}: name the section, e.g. algorithm.lr=0.05; sections: {', '.join(SECTIONS)}"
        )
    if section not in SECTIONS and section not in NESTED:
        raise unknown_key(section, [*SECTIONS, *NESTED], "--set")
    table = doc.setdefault(section, {})
    table[key] = parse_value(raw)


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """A validated RunConfig from a config file (or defaults) plus ``section.key=value`` overrides."""
    doc = read_config_file(path) if path is not None else {}
    for assignment in overrides:
        apply_override(doc, assignment)
    return config_from_sections(doc)


def _toml_value(value: Any) -> str:
    if value is None:
        return f'"{NONE}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, e.g. data.normalize = {mean = [...], std = [...]}
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def dumps_toml(doc: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """Write a sectioned dict of scalars and lists as TOML."""
    lines = [f"# {line}" for line in header.splitlines()]
    for section, table in doc.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def changed_settings(cfg: RunConfig) -> list[str]:
    """``section.key = value`` for every setting of ``cfg`` that differs from its default, the
    algorithm's hyperparameters and the ``[pretrain]`` / ``[privacy]`` keys included."""
    lines = []
    for name, value in non_default(cfg).items():
        if name == "options" or name in NESTED:
            table = "algorithm" if name == "options" else name
            unset = PRIVACY_DEFAULTS if name == PRIVACY else {}  # [privacy]'s defaults are filled in
            lines += [
                f"{table}.{k} = {_toml_value(v)}" for k, v in value.items() if k not in unset or unset[k] != v
            ]
        else:
            lines.append(f"{section_of(name)}.{name} = {_toml_value(value)}")
    return lines


def config_to_toml(cfg: RunConfig, header: str = "") -> str:
    return dumps_toml(config_to_sections(cfg), header)
