"""``python -m fedxrisk.flower``: write a Flower app folder; export a trial split as site folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fedxrisk.flower import FLWR_REQUIREMENT
from fedxrisk.flower.config import FlowerConfig, default_run_config, flat_value

APP_MODULE = '''"""fedxrisk's Flower app: the components live in the installed fedxrisk package."""

from fedxrisk.flower.app import client_app, server_app

__all__ = ["client_app", "server_app"]
'''


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def app_pyproject(run_config: dict[str, Any], name: str = "fedxrisk-app") -> str:
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        f'name = "{name}"',
        'version = "1.0.0"',
        'description = "fedxrisk on Flower: federated AUC-type risk optimization across sites"',
        'license = "MIT"',
        f'dependencies = ["{FLWR_REQUIREMENT}", "fedxrisk"]',
        "",
        "[tool.flwr.app]",
        'publisher = "fedxrisk"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "fedxrisk_app:server_app"',
        'clientapp = "fedxrisk_app:client_app"',
        "",
        "[tool.flwr.app.config]",
        *(f"{key} = {_toml_value(value)}" for key, value in run_config.items()),
        "",
    ]
    return "\n".join(lines)


def write_app(folder: str | Path, overrides: dict[str, Any] | None = None) -> Path:
    """Write ``pyproject.toml`` and ``fedxrisk_app.py``: the folder ``flwr run`` builds a FAB from."""
    run_config = default_run_config() | {k: flat_value(v) for k, v in (overrides or {}).items()}
    FlowerConfig.from_run_config(run_config)  # fail here, not on the SuperLink
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(app_pyproject(run_config))
    (root / "fedxrisk_app.py").write_text(APP_MODULE)
    return root


def _parse_set(items: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text
    return out


@click.group()
def main() -> None:
    """Deploy fedxrisk on Flower (see docs/flower.md)."""


@main.command("new-app")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--set", "settings", multiple=True, help="run-config default, e.g. --set algorithm=codasca")
def new_app(folder: str, settings: tuple[str, ...]) -> None:
    """Write a Flower app folder (pyproject.toml with every run-config key, fedxrisk_app.py)."""
    try:
        root = write_app(folder, _parse_set(settings))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {root / 'pyproject.toml'} and {root / 'fedxrisk_app.py'}")


@main.command("export-trial")
@click.argument("dataset")
@click.option("--sites", type=int, default=2, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--set", "settings", multiple=True, help="split settings: partition, imratio, seed, ...")
def export_trial_cmd(dataset: str, sites: int, out: str, settings: tuple[str, ...]) -> None:
    """Write a bundled dataset's split as OUT/site-K/train.npz (one folder per site) and OUT/test.npz."""
    from fedxrisk.flower.sitedata import export_trial

    try:
        cfg = FlowerConfig.from_run_config(_parse_set(settings))
        folders = export_trial(cfg, dataset, sites, out)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    for folder in folders:
        click.echo(f"wrote {folder / 'train.npz'}")
    click.echo(f"wrote {Path(out) / 'test.npz'}")


if __name__ == "__main__":
    main()
