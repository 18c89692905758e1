"""``fedxrisk run``: train one experiment, or continue one with ``--resume``."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape

from fedxrisk.cli.common import (
    ConfigError,
    config_errors,
    console,
    main,
    resolve,
    typed_flags,
    with_config_options,
)
from fedxrisk.cli.flags import with_setting_flags
from fedxrisk.cli.progress import Bar, training_progress
from fedxrisk.textsafe import printable

if TYPE_CHECKING:
    from fedxrisk.engines import NonFiniteLoss


def set_threads(threads: int | None, model: str | None) -> int:
    """:func:`fedxrisk.run.threads.set_threads` (imported when a run starts: it imports torch)."""
    from fedxrisk.run.threads import set_threads as set_run_threads

    return set_run_threads(threads, model)


def _model_of(model: str | None, resume: str | None) -> str | None:
    """The run's model: given, or read from the resumed folder's config.toml (None if unreadable)."""
    if model is not None or resume is None:
        return model
    import tomllib

    try:
        return tomllib.loads((Path(resume) / "config.toml").read_text())["model"]["model"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None


def non_finite_advice(e: NonFiniteLoss, folder: Path) -> str:
    """The NaN message, what was kept, and how to continue."""
    kept = f"{e}. History so far is kept in {folder}"
    if (folder / "checkpoint.pt").exists():
        return f"{kept}; continue from the last finite checkpoint with smaller steps: fedxrisk run --resume {folder} --set algorithm.lr=<lower>"
    return f"{kept}; no checkpoint was reached: start again with a lower --lr"


@main.command()
@with_config_options
@click.option(
    "--resume",
    type=click.Path(file_okay=False),
    default=None,
    help="continue a killed run from its folder (its own config); with --rounds N, extend a finished one",
)
@with_setting_flags  # one flag per RunConfig field declared with flag= (run/spec.py)
@click.option(
    "--pretrain-rounds",
    type=int,
    default=None,
    help="rounds of a cross-entropy [pretrain] stage before this run (same as --set pretrain.rounds=N)",
)
@click.option(
    "--option", "-o", "options", multiple=True, help="algorithm hyperparameter KEY=VALUE (repeatable)"
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="output folder (default runs/<time>-<alg>-<data>)",
)
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=None,
    help="torch CPU threads (default: 1 for the small models, as OMP_NUM_THREADS says if set, "
    "else torch's default; 0: torch's default); docs/performance.md",
)
@click.option(
    "--nproc-per-node",
    "nproc",
    type=click.IntRange(min=1),
    default=None,
    help="distributed: start N ranks on this machine (as torchrun --standalone) after checking the "
    "config here; a failure is reported in one line (docs/distributed.md)",
)
@click.option("--quiet", "-q", is_flag=True, help="no progress bar or summary table")
def run(
    config_file: str | None,
    overrides: tuple[str, ...],
    resume: str | None,
    options: tuple[str, ...],
    out: str | None,
    quiet: bool,
    threads: int | None,
    nproc: int | None,
    **flags: Any,
) -> None:
    """Train one federated experiment; write config.toml, history.csv, summary.json.

    A server optimizer: --set server.optimizer=adam --set server.lr=0.01 (docs/cli.md);
    personalization: --personal head|bn (docs/personalization.md).

    Settings come from --config FILE, then the flags typed here, then --set.
    """
    # torch-free until the config is checked: a config error costs a fraction of a second
    from fedxrisk.engines.launch import launched_rank, planned_world
    from fedxrisk.errors import BadFileError, DistributedError, NonFiniteLoss
    from fedxrisk.run.checks import check_data_dir
    from fedxrisk.run.configfile import config_from_sections
    from fedxrisk.run.spec import settings

    pretrain_rounds = flags.pop("pretrain_rounds")  # not a RunConfig field: a [pretrain] key
    given = typed_flags(click.get_current_context(), flags)
    with config_errors():
        if resume is not None:
            rounds = given.pop("rounds", None)  # --resume RUN --rounds N: extend a finished run
            extra = [settings()[k].flag for k in given] + (["--config"] if config_file else [])
            extra += [*(["--option"] if options else []), *(["--out"] if out else [])]
            extra += ["--pretrain-rounds"] if pretrain_rounds is not None else []
            if extra:
                raise ConfigError(
                    f"--resume continues a run with its own config; drop {', '.join(extra)} "
                    "(it takes only --rounds N to extend a finished run, and --set algorithm.lr=… / "
                    "algorithm.lr_decay=…)"
                )
            folder = Path(resume)
        else:
            if pretrain_rounds is not None:  # --set pretrain.rounds still wins
                overrides = (f"pretrain.rounds={pretrain_rounds}", *overrides)
            doc = resolve(config_file, given, options, overrides)
            with planned_world(nproc) if nproc else nullcontext():  # the ranks' layout, checked here
                cfg = config_from_sections(doc)
            check_data_dir(cfg)
        if nproc is not None:
            child = [
                *(["--quiet"] if quiet else []),
                *([f"--threads={threads}"] if threads is not None else []),
            ]
            if resume is not None:
                child += ["--resume", resume, *([f"--rounds={rounds}"] if rounds else [])]
                child += [f"--set={o}" for o in overrides]
            launch_ranks(nproc, child, None if resume else cfg, None if resume else doc, out)
        from fedxrisk.run.callbacks import Announce
        from fedxrisk.run.folder import default_out_dir
        from fedxrisk.run.recipes import resume_experiment, run_experiment

        if resume is not None:
            job = lambda callback, hooks: resume_experiment(folder, callback, overrides, hooks, rounds)
        else:
            folder = Path(out) if out else default_out_dir(cfg)
            job = lambda callback, hooks: run_experiment(cfg, folder, callback, hooks)
        set_threads(threads, _model_of(cfg.model if resume is None else None, resume))

        secondary = launched_rank() != 0  # under torchrun only rank 0 reports
        try:
            if quiet or secondary:
                result = job(None, [])
            else:
                with training_progress() as progress:
                    say = lambda line: progress.console.print(escape(line), soft_wrap=True)
                    result = job(Bar(progress, "training"), [Announce(say)])
        except NonFiniteLoss as e:
            console.print(
                f"[red]error:[/red] {escape(printable(non_finite_advice(e, folder)))}", soft_wrap=True
            )
            sys.exit(1)
        except BadFileError as e:  # a corrupt file met while training: the checkpoint is kept
            console.print(
                f"[red]error:[/red] {escape(str(e).replace('RUN_DIR', str(folder)))}", soft_wrap=True
            )
            sys.exit(1)
        except DistributedError as e:
            console.print(f"[red]error:[/red] {escape(printable(str(e)))}", soft_wrap=True)
            sys.exit(1)
        except KeyboardInterrupt:
            console.print(f"interrupted; continue with: fedxrisk run --resume {folder}")
            sys.exit(130)
    if secondary:
        return
    if not quiet:
        _print_summary(result.summary, result.out_dir)
    else:
        click.echo(str(result.out_dir))


def launch_ranks(
    nproc: int, child_args: list[str], cfg: Any, doc: dict[str, Any] | None, out: str | None
) -> None:
    """``--nproc-per-node N``: the checked config (``cfg``, from ``doc``) or the resumed run
    (``doc`` None), trained by N ranks on this machine; exits with the ranks' status. The ranks
    print their own errors, once; torchrun's failure report is not shown."""
    import os
    import tempfile

    from fedxrisk.engines.launch import launch_local
    from fedxrisk.run.configfile import dumps_toml

    if "WORLD_SIZE" in os.environ:
        raise ConfigError("--nproc-per-node starts the ranks itself: drop it under torchrun")
    if doc is not None and cfg.engine != "distributed":
        raise ConfigError("--nproc-per-node starts distributed ranks: add --engine distributed")
    with tempfile.TemporaryDirectory(prefix="fedxrisk-launch-") as tmp:
        if doc is not None:  # the ranks read the same settings, unresolved (lr left to the data)
            from fedxrisk.run.folder import default_out_dir

            config = Path(tmp) / "config.toml"
            config.write_text(dumps_toml(doc), encoding="utf-8")
            child_args = [*child_args, "--config", str(config), "--out", str(out or default_out_dir(cfg))]
        sys.exit(launch_local(nproc, ["run", *child_args]))


def _fmt(x: Any) -> str:
    if isinstance(x, list):  # per-label metrics
        return ", ".join(map(_fmt, x))
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _method(s: dict[str, Any]) -> str:
    """The algorithm with what changes the model it writes: the server optimizer, personalization."""
    cfg, parts = s.get("config", {}), [s["algorithm"]]
    server = cfg.get("server") or {}
    if server.get("optimizer"):
        parts.append(f"server {server['optimizer']} (lr {server.get('lr', 'default')})")
    if cfg.get("personal", "none") != "none":
        parts.append(f"personal {cfg['personal']}")
    if cfg.get("finetune_steps"):
        parts.append(f"fine-tuned {cfg['finetune_steps']} steps")
    return " + ".join(parts)


def _deployed_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Each site's own (deployed) model against the global model on that site's test rows."""
    block = s.get("personal") or {}
    sites = (s.get("data") or {}).get("client_sites") or []
    rows = []
    for k in range(s["num_clients"]):
        if f"site_auroc_{k}" not in block:
            continue
        name = f"site {k}" + (f" ({sites[k]})" if k < len(sites) else "")
        own, shared = block[f"site_auroc_{k}"], block.get(f"site_global_auroc_{k}")
        text = f"{_fmt(own)} / {_fmt(shared)}"
        if f"site_val_auroc_{k}" in block:  # the same pair on the site's validation rows
            text += f" (validation {_fmt(block[f'site_val_auroc_{k}'])} / {_fmt(block[f'site_global_val_auroc_{k}'])})"
        if k in (block.get("global_model_sites") or []):
            text += " — one class in training: deploys the global model"
        rows.append((f"{name} AUROC: deployed model / global", text))
    if "personal_auroc_mean" in block:
        rows.append(
            ("sites' deployed models, mean AUROC", f"{_fmt(block['personal_auroc_mean'])} "
             f"(global model at the sites: {_fmt(block.get('global_site_auroc_mean'))})")
        )  # fmt: skip
    for low in block.get("below_chance_sites") or []:
        rows.append((f"site {low['site']} BELOW CHANCE", f"{low['metric']} {_fmt(low['value'])}"))
    return rows


def _print_summary(s: dict[str, Any], out: Any) -> None:
    from fedxrisk.tables import fit_table

    title = (
        f"{_method(s)} on {s['dataset']}: K={s['num_clients']}, I={s['local_steps']}, {s['rounds']} rounds"
    )
    rows = [(f"final {k}", _fmt(v)) for k, v in s["final"].items()]
    rows += _deployed_rows(s)
    sel = s.get("selected")
    if sel and sel["selection"] == "best":  # the model in model.pt, chosen on validation
        rows.append((f"selected on {sel['monitor']}", f"{_fmt(sel['value'])} (round {sel['round']})"))
        key = "test_cindex" if "test_cindex" in sel else "test_auroc"
        rows.append((f"selected {key}", _fmt(sel.get(key))))
    if s.get("test_cindex"):  # a survival run: model.pt's C-index with its patient-bootstrap interval
        from fedxrisk.stats.survival import describe

        report = s["test_cindex"]
        rows.append(("test C-index, pooled [95% CI]", describe(report["pooled"])))
        if "mean_over_sites" in report:
            rows.append(("test C-index, mean over sites", describe(report["mean_over_sites"])))
        rows += [(f"test C-index, {name}", describe(entry)) for name, entry in report["per_site"].items()]
    comm = s["communication"]
    rows.append(("bytes up / client", f"{comm['bytes_up_per_client']:,}"))
    rows.append(("bytes down / client", f"{comm['bytes_down_per_client']:,}"))
    rows.append(("wall seconds", _fmt(s["wall_seconds"])))
    Console().print(fit_table(title, ["metric", "value"], rows, Console().width))
    if s.get("init"):
        source = s["init"]["from"] or "a fresh model"
        Console().print(
            f"started from {source}"
            + (" (classifier head re-initialised)" if s["init"]["reset_head"] else "")
        )
    if s.get("resumed_at_rounds"):
        Console().print(f"resumed at round(s) {', '.join(map(str, s['resumed_at_rounds']))}")
    Console().print(f"written to [bold]{out}[/bold] (summary.json, history.csv, config.toml, model.pt)")
