"""Recipes: a whole run, composed of check → build → train; one stage, two stages, resume.

:func:`run_experiment` and :func:`resume_experiment` are the public entries;
the config is checked once (:func:`fedxrisk.run.checks.checked`) and the checked
value travels to every build. Nothing in the package below this module imports it.

Two-stage runs: a ``[pretrain]`` stage, then the main (AUC) stage from its model.

The FDAM chest X-ray protocol (Yuan et al. 2021, §6.2) and LibAUC's practice:
train with cross-entropy first, then continue from that network with an AUC
loss (``model.reset_head = true`` discards the cross-entropy classifier).

Config::

    [pretrain]
    algorithm = "localsgdm"   # default: cross-entropy FedAvg; "centralized": one client, all data
    rounds = 20               # keys not given take the main stage's value, except
    lr = 0.1                  # algorithm, lr, local_steps and hyperparameters (the
    momentum = 0.9            # pretrain algorithm's defaults) and reset_head (false)

Data, model, seed and engine are shared; ``model.init_from`` is where the *first*
stage starts. Run folder::

    RUN/config.toml           the whole two-stage config (re-runnable)
    RUN/pretrain/             a complete run folder of stage 1 (config.toml, history.csv,
                              summary.json, model.pt; checkpoint.pt while unfinished)
    RUN/history.csv, summary.json, model.pt   the main stage; its history starts with a
                              round-0 row (the pretrained model's metrics) and its
                              summary's ``init`` records the source and stage 1's summary

``fedxrisk run --resume RUN`` continues whichever stage was interrupted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedxrisk.engines.distributed import launched_rank
from fedxrisk.errors import ConfigError
from fedxrisk.run import checks
from fedxrisk.run.build import Setup, build
from fedxrisk.run.callbacks import Callback, ProgressFn, default_callbacks
from fedxrisk.run.checks import CheckedConfig
from fedxrisk.run.folder import (
    CHECKPOINT,
    PRETRAIN_DIR,
    RunFolder,
    RunResult,
    check_out_dir,
    default_out_dir,
    load_checkpoint,
    refuse_run,
    write_config,
)
from fedxrisk.run.identity import config_difference, differing_keys, fingerprint, same_config
from fedxrisk.run.loop import train
from fedxrisk.run.spec import RunConfig
from fedxrisk.run.stage import CENTRALIZED
from fedxrisk.run.threads import set_threads

SUMMARY_KEYS = ("status", "algorithm", "rounds", "final", "selected", "wall_seconds", "communication")


def run_experiment(
    cfg: RunConfig,
    out_dir: str | Path | None = None,
    callback: ProgressFn | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Train, evaluating every ``eval_every`` rounds and at the end; write history and summary.

    The folder gets ``config.toml`` first, then ``history.csv`` row by row and a
    checkpoint every ``cfg.checkpoint_every`` rounds; a killed run continues with
    :func:`resume_experiment`. On a NaN/inf loss the run stops: the history written
    so far is kept, the summary records ``status: failed`` and the round, and
    :class:`NonFiniteLoss` is raised. ``callback(row or {}, rounds done, total)`` reports
    progress; ``callbacks`` (:class:`~fedxrisk.run.callbacks.Callback`) hook into the loop.
    """
    checked = checks.checked(cfg)
    set_threads(
        None, cfg.model
    )  # one thread for the small models, as `fedxrisk run` (OMP_NUM_THREADS: yours)
    out = Path(out_dir) if out_dir is not None else default_out_dir(cfg)
    if launched_rank() == 0:  # before the data is loaded: a bad --out fails fast
        check_out_dir(out)
    if cfg.pretrain is not None:
        return run_two_stage(checked, out, callback, callbacks)
    setup = build(checked)
    folder = RunFolder(out, setup.simulation.is_primary)  # distributed: only rank 0 writes
    folder.start(setup.config)  # the step size as built (a data-dependent default filled in)
    return train(setup, folder, default_callbacks(callback, callbacks), None)


def resume_experiment(
    run_dir: str | Path,
    callback: ProgressFn | None = None,
    overrides: Sequence[str] = (),
    callbacks: Sequence[Callback] = (),
    rounds: int | None = None,
) -> RunResult:
    """Continue a killed or failed run from its last checkpoint (or from the start if it had none yet).

    The final metrics equal those of an uninterrupted run bit for bit (same
    machine, engine and seed): the checkpoint holds every client's state and
    sampler RNG, the byte ledger, the history and the best row so far.
    ``history.csv`` is rewritten from the checkpoint, dropping rows evaluated
    after it; ``wall_seconds`` counts the time of the rounds kept. A run whose
    summary exists but whose ``model.pt`` does not (killed in between) is
    finished the same way. ``overrides`` (``algorithm.lr=…``, ``algorithm.lr_decay=…``)
    continue a run that failed on a NaN loss with smaller steps. ``rounds``: extend a finished
    run to that many rounds (:func:`extend_experiment`).
    """
    from fedxrisk.run.configfile import config_from_flat, load_config

    out = Path(run_dir)
    if not out.is_dir():
        raise ConfigError(f"{out} is not a run folder")
    if rounds is not None:
        return extend_experiment(out, rounds, callback, overrides, callbacks)
    if (out / "summary.json").exists():
        status = _status(out)
        if status == "completed" and (out / "model.pt").exists():
            raise ConfigError(f"{out} already finished (status: {status}); nothing to resume")
    ckpt = load_checkpoint(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    if ckpt is not None:
        cfg = check_identity(out, ckpt, config_from_flat(ckpt["config"]))
    elif (out / "config.toml").exists():  # killed before its first checkpoint
        cfg = load_config(out / "config.toml")
    else:
        raise ConfigError(f"{out} holds neither {CHECKPOINT} nor config.toml: not a fedxrisk run folder")
    if overrides:
        cfg = resume_overrides(cfg, overrides)
    checked = checks.checked(cfg)
    loaded = (lambda: write_config(out, cfg)) if overrides else None  # once the saved state loads
    if cfg.pretrain is not None:
        return resume_two_stage(checked, out, ckpt, callback, callbacks, loaded)
    setup = build(checked, privacy_ledger=ckpt.get("privacy_ledger") if ckpt else None)
    if ckpt is not None:
        setup.simulation.load_state_dict(ckpt["simulation"])  # a checkpoint that does not fit: refused
    if loaded:
        loaded()  # the run can go on: a refusal leaves config.toml as it was
    folder = RunFolder(out, setup.simulation.is_primary)
    return train(setup, folder, default_callbacks(callback, callbacks), ckpt)


def _summary_to_extend(out: Path) -> dict[str, Any]:
    """summary.json of a run to extend ({} when there is none), or one line saying it is damaged."""
    path = out / "summary.json"
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        summary = e
    if not isinstance(summary, dict):
        reason = type(summary).__name__ if isinstance(summary, Exception) else "not a JSON object"
        raise ConfigError(
            f"{path} is unreadable ({reason}): whether the run finished is unknown, so --rounds cannot extend "
            "it; restore summary.json, or start a run with the rounds wanted"
        )
    return summary


def _status(out: Path) -> str | None:
    """summary.json's status; a damaged summary is no status, unless model.pt says the run may have
    finished (a restart would then replace a finished model): one line."""
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        return summary.get("status") if isinstance(summary, dict) else None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        if (out / "model.pt").exists():
            raise ConfigError(
                f"{out / 'summary.json'} is unreadable ({type(e).__name__}) and model.pt exists: the run may "
                "have finished; nothing to resume (move summary.json away to resume anyway)"
            ) from None
        return None


def check_identity(out: Path, ckpt: dict[str, Any], cfg: RunConfig) -> RunConfig:
    """The config to continue: the checkpoint's, which must be this folder's ``config.toml``.

    An edited config or a foreign checkpoint is refused with the way to start a new run
    from the config; a config.toml that differs in the step size only (written by
    ``--resume --set algorithm.lr=…`` after the checkpoint) is the one continued.
    """
    from fedxrisk.run.configfile import load_config

    stored = ckpt.get("config_sha256")
    if stored is not None and stored != fingerprint(ckpt["config"]):
        raise ConfigError(f"{out / CHECKPOINT}: its config does not match its own fingerprint (damaged)")
    if not (out / "config.toml").exists():
        return cfg
    from_file = load_config(out / "config.toml")
    written = from_file.to_dict()
    if not same_config(written, cfg.to_dict()):
        steps = {key.split(".")[1] for key in RESUME_KEYS}
        if set(differing_keys(written, cfg.to_dict())) <= steps:
            return from_file
        raise ConfigError(
            f"{out}/config.toml differs from the run in {CHECKPOINT} ({config_difference(written, cfg.to_dict())}); "
            f"--resume continues the checkpoint's run only: start a new run from this config with "
            f"`fedxrisk run --config {out}/config.toml --out NEW_FOLDER`, or restore the original config.toml"
        )
    return cfg


def extend_experiment(
    run_dir: str | Path,
    rounds: int,
    callback: ProgressFn | None = None,
    overrides: Sequence[str] = (),
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Train a finished run on to ``rounds`` rounds from the state it ended in (``final_state.pt``).

    The result equals a run planned with ``rounds`` from the start (same machine, engine,
    seed; tested) when the schedule has one stage and the algorithm does nothing special at
    a stage's end. Refused with several stages (each stage's length, hence the step-size
    decay, follows from the total rounds) and for two-stage runs; for algorithms that act at
    a stage end (the CODA family's restart), the extension continues from the restarted
    state, so it is a warning, not an equality.
    """
    import warnings

    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.run.configfile import config_from_flat
    from fedxrisk.run.folder import FINAL_STATE

    out = Path(run_dir)
    summary = _summary_to_extend(out)
    if summary.get("status") != "completed" or (out / CHECKPOINT).exists():
        raise ConfigError(f"{out} has not finished; continue it first with: fedxrisk run --resume {out}")
    if not (out / FINAL_STATE).exists():
        raise ConfigError(
            f"{out} kept no {FINAL_STATE} (runs with checkpoint_every = 0, or finished before runs kept "
            "their end state): it cannot be extended; start a run with the rounds wanted"
        )
    ckpt = load_checkpoint(out / FINAL_STATE)
    cfg = config_from_flat(ckpt["config"])
    if rounds <= cfg.rounds:
        raise ConfigError(f"--rounds {rounds} does not extend {out}: it already ran {cfg.rounds} rounds")
    if cfg.pretrain is not None:
        raise ConfigError(f"{out} is a two-stage run; extending it is not supported")
    if cfg.stages > 1:
        raise ConfigError(
            f"{out} ran {cfg.stages} stages over {cfg.rounds} rounds: with {rounds} rounds every stage "
            "is longer and the step size decays later, so no extension equals it; start a new run"
        )
    if overrides:
        cfg = resume_overrides(cfg, overrides)
    if ALGORITHMS[cfg.algorithm].acts_at_stage_end:
        warnings.warn(
            f"{cfg.algorithm} restarts at a stage's end, which this run reached at round {cfg.rounds}: "
            f"the extension continues from there and differs from a run planned with {rounds} rounds",
            stacklevel=2,
        )
    cfg = replace_rounds(cfg, rounds)
    checked = checks.checked(cfg)
    if cfg.privacy is not None and "privacy_ledger" not in ckpt:
        raise ConfigError(f"{out} kept no DP ledger (run before issue 30): its ε cannot be extended")
    setup = build(checked, privacy_ledger=ckpt.get("privacy_ledger"))
    setup.simulation.load_state_dict(ckpt["simulation"])  # a checkpoint that does not fit: refused here
    write_config(out, cfg)  # only then: a refusal leaves the folder as it was
    result = train(
        setup, RunFolder(out, setup.simulation.is_primary), default_callbacks(callback, callbacks), ckpt
    )
    return result


def replace_rounds(cfg: RunConfig, rounds: int) -> RunConfig:
    import dataclasses

    return dataclasses.replace(cfg, rounds=rounds)


RESUME_KEYS = ("algorithm.lr", "algorithm.lr_decay")


def resume_overrides(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """``cfg`` with ``--set`` overrides that a resumed run may take (the step size only)."""
    from fedxrisk.run.configfile import apply_override, config_from_sections, config_to_sections

    doc = config_to_sections(cfg)
    for text in overrides:
        name = text.split("=", 1)[0].strip()
        if name not in RESUME_KEYS:
            raise ConfigError(
                f"--resume takes --set {' or '.join(RESUME_KEYS)} only (to continue with smaller steps), got {name!r}"
            )
        apply_override(doc, text)
    return config_from_sections(doc)


def _summary_of(folder: Path) -> dict[str, Any]:
    summary = json.loads((folder / "summary.json").read_text())
    if summary.get("status") != "completed":
        raise ConfigError(
            f"{folder} (the pretrain stage) ended with status {summary.get('status')!r}: "
            f"{summary.get('error')}; the main stage needs its model.pt"
        )
    return summary


def _finish_stage1(setup: Setup, folder: RunFolder, callbacks: list[Callback], ckpt: dict[str, Any] | None):
    """Train stage 1 to its end; its summary and final network, in memory (under torchrun every
    rank holds it, so no rank waits for rank 0 to write ``model.pt``)."""
    result = train(setup, folder, callbacks, ckpt)
    params, buffers = setup.simulation.global_model()
    return result.summary, {k: v.detach().clone() for k, v in {**params, **buffers}.items()}  # no views


def _main_stage(
    cfg: CheckedConfig,
    out: Path,
    callbacks: list[Callback],
    ckpt: dict[str, Any] | None,
    data_from: Setup | None = None,
    stage1: tuple[dict[str, Any], dict[str, Any]] | None = None,
    loaded: Callable[[], None] | None = None,
) -> RunResult:
    """Build the main stage from stage 1's network (``stage1``, else ``out/pretrain``) and train it;
    ``loaded()`` once the checkpoint (if any) has loaded."""
    if stage1 is None:
        stage1 = _summary_of(out / PRETRAIN_DIR), None
    pre, weights = stage1
    setup = build(cfg, init=weights if weights is not None else out / PRETRAIN_DIR, data_from=data_from)
    setup.init = {
        **(setup.init or {}),
        "from": PRETRAIN_DIR,
        "pretrain": {k: pre.get(k) for k in SUMMARY_KEYS},
    }
    if ckpt is not None:
        setup.simulation.load_state_dict(ckpt["simulation"])
    if loaded:
        loaded()
    return train(setup, RunFolder(out, setup.simulation.is_primary), callbacks, ckpt)


def run_two_stage(
    cfg: RunConfig | CheckedConfig,
    out: Path,
    callback: ProgressFn | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Stage 1 in ``out/pretrain``, then the main stage in ``out`` from its network.

    Both stages are built (data loaded, ``init_from`` read) before anything is written.
    """
    checked = checks.checked(cfg)
    first = checked.pretrain
    assert first is not None, "run_two_stage needs a config with [pretrain]"
    main = build(checked)  # loads the main stage's data
    shared = checked.config.pretrain.get("algorithm") != CENTRALIZED  # type: ignore[union-attr]
    pre = build(first, data_from=main if shared else None)
    main.simulation = main.algorithm = main.problem = None  # type: ignore[assignment]  # keep only the data
    folder = RunFolder(out, pre.simulation.is_primary)
    if folder.primary:
        refuse_run(out, (PRETRAIN_DIR,))  # re-checked: the data took time to load
    folder.start(checked.config)
    folder.stage().start(first.config)
    stage1 = _finish_stage1(pre, folder.stage(), default_callbacks(callback, callbacks), None)
    del pre  # stage 1's client states
    return _main_stage(checked, out, default_callbacks(callback, callbacks), None, main, stage1)


def resume_two_stage(
    cfg: RunConfig | CheckedConfig,
    out: Path,
    ckpt: dict[str, Any] | None,
    callback: ProgressFn | None = None,
    callbacks: Sequence[Callback] = (),
    loaded: Callable[[], None] | None = None,
) -> RunResult:
    """Continue a killed two-stage run: finish stage 1 if needed, then the main stage; ``loaded()``
    once the saved state it continues from has loaded (``config.toml`` rewritten only then)."""
    checked = checks.checked(cfg)
    folder = out / PRETRAIN_DIR
    stage1 = None
    if ckpt is None and not (folder / "summary.json").exists():
        pre = build(checked.pretrain)  # type: ignore[arg-type]
        pre_folder = RunFolder(folder, pre.simulation.is_primary)
        pre_ckpt = load_checkpoint(folder / CHECKPOINT) if (folder / CHECKPOINT).exists() else None
        if pre_ckpt is not None:
            pre.simulation.load_state_dict(pre_ckpt["simulation"])
        else:  # killed before stage 1's first checkpoint
            pre_folder.start(pre.config)
        if loaded:
            loaded()
            loaded = None
        stage1 = _finish_stage1(pre, pre_folder, default_callbacks(callback, callbacks), pre_ckpt)
        del pre, pre_ckpt  # stage 1's client states
    return _main_stage(
        checked, out, default_callbacks(callback, callbacks), ckpt, stage1=stage1, loaded=loaded
    )
