"""What every command shares: the ``main`` group, the console, config options and error handling."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

# Only torch-free modules at the top: `fedxrisk --help`, `fedxrisk list` and argument errors must not
# import torch (benchmarks/startup.py); commands import what they need when they run.
from fedxrisk.errors import ConfigError
from fedxrisk.run.spec import RunConfig

console = Console(stderr=True)
DEFAULTS = RunConfig()


class BadConfig(click.ClickException):
    """One line on stderr (``Error: ...``) and exit status 2; nothing is written."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        from fedxrisk.textsafe import printable

        super().__init__(printable(message, keep="\n"))  # no terminal escape codes from file names


@contextmanager
def config_errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as e:
        raise BadConfig(str(e)) from None


def _parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as a TOML value (number, bool, list, "none") or kept as text."""
    from fedxrisk.run.configfile import parse_value

    if "=" not in text:
        raise ConfigError(f"--option expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    return key.strip(), parse_value(raw)


def typed_flags(ctx: click.Context, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags typed on the command line (not left at their defaults)."""
    return {k: v for k, v in flags.items() if ctx.get_parameter_source(k) is not ParameterSource.DEFAULT}


def resolve(
    config_file: str | None, flags: dict[str, Any], options: tuple[str, ...], overrides: tuple[str, ...]
) -> dict[str, Any]:
    """Config file, then flags typed on the command line, then ``--option``, then ``--set``."""
    from fedxrisk.run.configfile import apply_override, read_config_file, section_of

    doc = read_config_file(config_file) if config_file else {}
    for key, value in flags.items():
        doc.setdefault(section_of(key), {})[key] = value
    for text in options:
        key, value = _parse_option(text)
        doc.setdefault("algorithm", {})[key] = value
    for text in overrides:
        apply_override(doc, text)
    return doc


CONFIG_OPTIONS = (
    click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="TOML config file (or a run's config.toml / summary.json)",
    ),
    click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="override one config key, e.g. --set algorithm.lr=0.05 (repeatable; applied last)",
    ),
)


def with_config_options(fn):
    for option in reversed(CONFIG_OPTIONS):
        fn = option(fn)
    return fn


@click.group()
@click.version_option(package_name="fedxrisk")
def main() -> None:
    """Federated learning of AUC-type risks on imbalanced data."""


def comma_list(text: str | None, cast: type) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ConfigError(f"expected a comma-separated list, got {text!r} ({e})") from None
