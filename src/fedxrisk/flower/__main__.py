"""``python -m fedxrisk.flower``: write a Flower app folder; export a trial split as site folders."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fedxrisk.errors import ConfigError
from fedxrisk.flower import DEFAULT_EVAL_DP, FLWR_REQUIREMENT
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


APP_FILES = ("pyproject.toml", "fedxrisk_app.py")


def write_app(
    folder: str | Path,
    overrides: dict[str, Any] | None = None,
    overwrite: bool = False,
    module: str = APP_MODULE,
    check: Callable[[FlowerConfig], None] | None = None,
) -> Path:
    """Write ``pyproject.toml`` and ``fedxrisk_app.py``: the folder ``flwr run`` builds a FAB from.

    An existing file of either name is replaced only with ``overwrite`` (a symbolic link never);
    the settings are checked first (the run's checks, Flower's, SecAgg+'s algorithm refusal and
    ``check``, the app's own), so nothing is written for a config the server would refuse."""
    from fedxrisk.flower.secure import check_secure_algorithm
    from fedxrisk.outfiles import make_folder, refuse_symlink, text_writer, write_together

    run_config = default_run_config() | {k: flat_value(v) for k, v in (overrides or {}).items()}
    cfg = FlowerConfig.from_run_config(run_config)  # fail here, not on the SuperLink
    check_secure_algorithm(cfg)
    if check is not None:  # the app's own refusals (an evaluation app's models), before any file
        check(cfg)
    root = Path(folder)
    refuse_symlink(root)  # a linked folder is written into by no one
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is a file, not a folder")
    for name in APP_FILES:
        refuse_symlink(root / name)
        if (root / name).exists() and not overwrite:
            raise ConfigError(
                f"{root / name} already exists; pass --overwrite to replace it, or choose another folder"
            )
    make_folder(root)
    texts = (app_pyproject(run_config), module)
    write_together({root / name: text_writer(text) for name, text in zip(APP_FILES, texts)})
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


class Refused(click.ClickException):
    """A refused setting or output: one ``Error:`` line, exit status 2 (as ``fedxrisk`` commands)."""

    exit_code = 2


@click.group()
def main() -> None:
    """Deploy fedxrisk on Flower (see docs/flower.md)."""


@main.command("new-app")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--set", "settings", multiple=True, help="run-config default, e.g. --set algorithm=codasca")
@click.option("--overwrite", is_flag=True, help="replace an existing pyproject.toml / fedxrisk_app.py")
def new_app(folder: str, settings: tuple[str, ...], overwrite: bool) -> None:
    """Write a Flower app folder (pyproject.toml with every run-config key, fedxrisk_app.py)."""
    try:
        root = write_app(folder, _parse_set(settings), overwrite)
    except ValueError as e:  # ConfigError and OutputError: one line, exit 2
        raise Refused(str(e)) from None
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
    except ValueError as e:  # ConfigError and OutputError: one line, exit 2
        raise Refused(str(e)) from None
    for folder in folders:
        click.echo(f"wrote {folder / 'train.npz'}")
    click.echo(f"wrote {Path(out) / 'test.npz'}")


@main.command("evaluate")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--model", required=True, help="the model to evaluate: model.pt or a run folder on the server")
@click.option(
    "--against", default=None, help="a second model on the same sites: the paired DeLong test (--exact)"
)
@click.option(
    "--site-auroc", is_flag=True, help="each site also releases its own AUROC [CI] and class counts (--exact)"
)
@click.option(
    "--exact",
    is_flag=True,
    help="the exact mode: the server learns the pooled per-class histograms exactly (not private)",
)
@click.option(
    "--dp-epsilon",
    type=float,
    default=None,
    help=f"ε of the default private release of the pooled histogram [default: {DEFAULT_EVAL_DP[0]:g}]",
)
@click.option("--dp-delta", type=float, default=DEFAULT_EVAL_DP[1], show_default=True)
@click.option("--set", "settings", multiple=True, help="run-config value, e.g. --set secure-aggregation=true")
def evaluate_cmd(
    folder: str, model: str, against: str | None, site_auroc: bool, exact: bool, dp_epsilon: float | None,
    dp_delta: float, settings: tuple[str, ...],
) -> None:  # fmt: skip
    """Write an app folder whose ServerApp evaluates MODEL at every site's test.npz: by default one
    (ε, δ)-DP release of the pooled histogram, noised by the sites; --exact: the two exact secure sums."""
    from fedxrisk.flower.evaluate import EXACT_DISCLOSURE, evaluation_app_module
    from fedxrisk.flower.evaluate_app import check_evaluation

    models = [model, *([against] if against else [])]
    if exact and dp_epsilon is not None:
        raise Refused("--exact releases no noised histogram: drop --dp-epsilon, or drop --exact")
    dp = None if exact else (DEFAULT_EVAL_DP[0] if dp_epsilon is None else dp_epsilon, dp_delta)
    try:  # the ServerApp's own check (models, --against, DP), run here: nothing is written on refusal
        module = evaluation_app_module(models, site_auroc, dp)
        check = lambda cfg: check_evaluation(models, cfg, site_auroc, dp)  # noqa: E731
        root = write_app(folder, _parse_set(settings), module=module, check=check)
    except ValueError as e:  # ConfigError and OutputError: one line, exit 2
        raise Refused(str(e)) from None
    click.echo(
        f"wrote {root / 'pyproject.toml'} and {root / 'fedxrisk_app.py'}; run it with: flwr run {root}"
    )
    if dp is None:
        click.echo(f"NOT PRIVATE — {EXACT_DISCLOSURE}")
    else:
        click.echo(
            f"private evaluation: one ({dp[0]:g}, {dp[1]:g})-DP release of the pooled histogram, noised by the sites"
        )


if __name__ == "__main__":
    main()
