"""``fedxrisk check``: every error of a config at once, or "ok" and what it changes."""

from __future__ import annotations

import sys
from typing import Any

import click

from fedxrisk.cli.common import ConfigError, config_errors, main


@main.command()
@click.argument("config_file", metavar="[CONFIG]", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="override one config key, as `fedxrisk run --set` (repeatable; applied last)",
)
def check(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Check a config (TOML, or a run's config.toml / summary.json) without running it.

    Prints every error, one line each, and exits with status 2; else prints "ok" and the
    settings that differ from the defaults, and exits 0. The algorithm's own checks of its
    hyperparameters and step sizes run too (they load torch); a file dataset's data_dir is
    checked on this machine. What needs the data itself (its input shape, label count, shard
    sizes) is checked when a run loads it; the "ok" output names those checks.
    """
    from fedxrisk.run.checks import check_data_dir
    from fedxrisk.run.combos import NEEDS_DATA
    from fedxrisk.run.configfile import apply_override, changed_settings, read_config_file, read_sections
    from fedxrisk.textsafe import printable

    errors: list[ConfigError] = []
    with config_errors():  # a file that cannot be read at all: one line, exit 2
        doc = read_config_file(config_file) if config_file is not None else {}
    for text in overrides:
        try:
            apply_override(doc, text)
        except ConfigError as e:
            errors.append(e)
    cfg, found = read_sections(doc, thorough=True)
    errors += found
    try:
        check_data_dir(cfg)
    except ConfigError as e:
        errors.append(e)
    if errors:
        for e in errors:
            click.echo(f"Error: {printable(str(e))}", err=True)
        sys.exit(2)
    click.echo("ok")
    for line in changed_settings(cfg):
        click.echo(printable(line))
    if (note := _update_noise(cfg)) is not None:
        click.echo(note, err=True)
    click.echo(
        f"note: not checked here (needs the data; `fedxrisk run` checks it on loading): {'; '.join(NEEDS_DATA)}",
        err=True,
    )


def _update_noise(cfg: Any) -> str | None:
    """Client-level DP with a given noise_multiplier: the noise-to-clip ratio of the mean update
    (``run/privacy_outputs.update_noise_note``), K = data.clients; with a target ε (σ needs the
    data's shard sizes and the accountant) the run states it at its start."""
    from fedxrisk.run.privacy_outputs import update_noise_note

    p = getattr(cfg, "privacy", None)
    if not p or p.get("level") != "client":
        return None
    if p.get("noise_multiplier") is None:
        return "note: client-level DP with target_epsilon: `fedxrisk run` states the noise-to-clip ratio of the mean update at its start"
    k = int(cfg.clients)
    note = update_noise_note("client", p["noise_multiplier"], p["sampling_rate"], k, p["clip"])
    return f"{note} [K = data.clients = {k}; a partition by source takes K from the data]"
