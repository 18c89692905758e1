"""The setting flags of ``fedxrisk run``, generated from :class:`~fedxrisk.run.spec.RunConfig`'s fields.

A field declared with ``flag="--name"`` (run/spec.py) becomes a click option with that field's help
text and its default shown; the option itself defaults to None (not typed), so that the default
lives on the field only and a flag overrides the config file only when it is typed. A value is
checked with the rest of the config (its type, its range), in one line. No torch.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import click

from fedxrisk.run.spec import Setting, settings


class SettingValue(click.ParamType):
    """A value of a setting with a union type (``float | None``, ``int | str``): read as a TOML
    value (``0.2``, ``none``, ``auto``) and checked against the setting's type with the config."""

    name = "value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from fedxrisk.run.configfile import parse_value

        return parse_value(value) if isinstance(value, str) else value


PLAIN = {int: click.INT, float: click.FLOAT, str: click.STRING}
NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT", type(None): "none"}


def _kind(hint: Any) -> tuple[click.ParamType, str | None]:
    """The click type of a setting's hint (an optional text is text), and a metavar for a union."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_args(hint) else [hint]
    if len(args) == 1 and args[0] in PLAIN and (args[0] is str or hint in PLAIN):
        return PLAIN[args[0]], None
    return SettingValue(), "|".join(NAMES.get(a, "VALUE") for a in typing.get_args(hint))


def _shown(default: Any) -> str:
    """The field's default as ``--help`` shows it; nothing for None / False (the help says)."""
    if default is None or default is False:
        return ""
    return f"  [default: {'true' if default is True else default}]"


def setting_option(s: Setting) -> Callable[[Any], Any]:
    """The click option of one setting; its default is shown from the field, never repeated here."""
    names = [s.flag, *([s.short] if s.short else []), s.name]
    if s.hint is bool and s.default is True:  # a switch that is on unless --no-…
        names[0] = f"{s.flag}/--no-{s.flag.removeprefix('--')}"  # type: ignore[union-attr]
        return click.option(*names, default=None, help=s.help + _shown(s.default))
    if s.hint is bool:
        return click.option(*names, is_flag=True, default=None, help=s.help)
    kind, metavar = _kind(s.hint)
    return click.option(*names, type=kind, metavar=metavar, default=None, help=s.help + _shown(s.default))


def flag_settings() -> list[Setting]:
    """The settings that have a ``fedxrisk run`` flag, in RunConfig's field order."""
    return [s for s in settings().values() if s.flag is not None]


def with_setting_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with every setting flag (in field order in ``--help``)."""
    for s in reversed(flag_settings()):
        fn = setting_option(s)(fn)
    return fn
