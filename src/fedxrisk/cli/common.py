"""What every command shares: the ``main`` group, the console, config options and error handling."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

# Only torch-free modules at the top: `fedxrisk --help`, `fedxrisk list` and argument errors must not
# import torch (benchmarks/timing/startup.py); commands import what they need when they run.
from fedxrisk.errors import ConfigError, errors_in
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
    """A :class:`ConfigError` as one ``Error:`` line (a ``ConfigErrors``: one per error), exit 2; under
    torchrun only rank 0 prints it (every rank meets the same mistake: it was printed once per rank)."""
    import os

    from fedxrisk.outfiles import DISK_ERRORS
    from fedxrisk.textsafe import printable

    try:
        yield
    except ConfigError as e:
        if os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ:
            sys.exit(2)
        *before, last = errors_in(e)  # ConfigErrors: a line each, as `fedxrisk check`
        for one in before:
            click.echo(f"Error: {printable(str(one))}", err=True)
        raise BadConfig(str(last)) from None
    except OSError as e:  # a full disk or a refused permission the output layer did not wrap: one line
        if e.errno not in DISK_ERRORS:
            raise
        raise BadConfig(f"{e.filename or 'a file'}: {e.strerror}") from None


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
    natural_ratio_default(doc)
    return doc


# The benchmarks whose papers' protocol resamples to an imbalance ratio: `--imratio 0.1` is their default.
# Every other dataset (a user's npz / tabular / folder / sites / manifest, the medical sets) keeps its own
# positive ratio unless --imratio is given.
RESAMPLED_BY_DEFAULT = frozenset(
    {
        "synthetic",
        "digits",
        "breast_cancer",
        "mnist1d",
        "mnist",
        "fashionmnist",
        "cifar10",
        "cifar100",
        "stl10",
    }
)


def natural_ratio_default(doc: dict[str, Any]) -> None:
    """Fill ``data.imratio = none`` for a dataset that is not a resampled benchmark when nothing set it;
    print one line when it is set there (resampling a user's data is a choice, said aloud)."""
    data = doc.get("data", {})
    dataset = data.get("dataset", DEFAULTS.dataset)
    if dataset in RESAMPLED_BY_DEFAULT:
        return
    if "imratio" not in data:
        doc.setdefault("data", {})["imratio"] = None
    elif data["imratio"] not in (None, "none"):
        console.print(
            f"note: resampling {dataset}'s training data to imratio {data['imratio']} (samples are dropped "
            "to reach it); --imratio none keeps its own positive ratio"
        )


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
        help="override one config key, e.g. --set algorithm.lr=0.05 (repeatable; applied last); sections: "
        "experiment, data, model, algorithm, engine, and the tables [server] (server.optimizer=adam, "
        "server.lr), [privacy], [pretrain]",
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
    import warnings

    previous = warnings.formatwarning
    warnings.formatwarning = one_line_warning  # for this command only: restored when it ends
    click.get_current_context().call_on_close(lambda: setattr(warnings, "formatwarning", previous))


@contextmanager
def warnings_once(quiet: bool = False) -> Iterator[None]:
    """Each warning shown once however many runs raise it (a tune's trials, a comparison's runs);
    none at all with ``quiet``."""
    import warnings

    seen: set[str] = set()
    previous = warnings.showwarning

    def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        if not quiet and str(message) not in seen:
            seen.add(str(message))
            previous(message, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def one_line_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> str:
    """A warning as one ``warning: …`` line, without Python's file, line number and source text."""
    from fedxrisk.textsafe import printable

    return f"warning: {printable(' '.join(str(message).split()))}\n"


def comma_list(text: str | None, cast: type, option: str = "the option") -> list[Any] | None:
    """``a,b,c`` as a list of ``cast`` values; None when not given; one line for no value or a bad one."""
    if text is None:
        return None
    try:
        values = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ConfigError(f"{option}: expected a comma-separated list, got {text!r} ({e})") from None
    if not values:
        raise ConfigError(f"{option}: expected a comma-separated list of at least one value, got {text!r}")
    return values
