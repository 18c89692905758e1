"""Type checks of config values: TOML values against RunConfig's type hints and the algorithms'
hyperparameter types (read from the catalogue, so that a wrong type is reported without torch)."""

from __future__ import annotations

import difflib
import numbers
import types
import typing
from collections.abc import Iterable
from typing import Any

from fedxrisk import catalog
from fedxrisk.errors import ConfigError

NONE = "none"  # how TOML spells None


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return f'"{NONE}"'
    if typing.get_origin(hint) is list:
        inner = typing.get_args(hint)[0]
        return "a list of " + {int: "integers", float: "numbers", str: "strings"}.get(
            inner, _type_name(inner)
        )
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


MISMATCH = object()


def coerce(value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` (int → float, "none" → None), or ``MISMATCH``."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if type(None) in args and (value is None or value == NONE):
            return None
        for arg in args:
            out = coerce(value, arg)
            if out is not MISMATCH:
                return out
        return MISMATCH
    if hint is type(None):
        return None if value is None or value == NONE else MISMATCH
    if origin is list:
        if not isinstance(value, list):
            return MISMATCH
        items = [coerce(v, typing.get_args(hint)[0]) for v in value]
        return MISMATCH if any(i is MISMATCH for i in items) else items
    if hint is bool:
        return value if isinstance(value, bool) else MISMATCH
    if hint is int:  # numbers.Integral: a NumPy integer from a search too
        return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else MISMATCH
    if hint is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        return MISMATCH
    if hint is str:
        return value if isinstance(value, str) else MISMATCH
    return value  # a type we do not know how to check: the algorithm validates it


def check_value(name: str, value: Any, hint: Any) -> Any:
    out = coerce(value, hint)
    if out is MISMATCH:
        raise ConfigError(f"{name}: expected {_type_name(hint)}, got {value!r} ({type(value).__name__})")
    return out


def hyperparameter_types(algorithm: str) -> dict[str, Any]:
    """Hyperparameter name → type hint (the default's type where the class has none), from the
    catalogue: no torch (:mod:`fedxrisk.catalog`)."""
    entry = catalog.algorithm(algorithm)
    if entry is None:
        raise KeyError(algorithm)
    return {name: catalog.hint_of(text) for name, text in entry["types"].items()}


def unknown_key(name: str, allowed: Iterable[str], where: str) -> ConfigError:
    allowed = sorted(allowed)
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown key {name!r}{hint}; {where} allows: {', '.join(allowed)}")
