"""The training loop: rounds, evaluation rows, checkpoints, the summary.

:func:`train` runs a built :class:`~fedxrisk.run.build.Setup` to its end (or
until a callback sets ``should_stop``), writing through a
:class:`~fedxrisk.run.folder.RunFolder`. Under the distributed engine every
rank trains and takes part in checkpoints (a collective); only the primary rank
evaluates and writes files. A Flower run is trained here too
(:class:`~fedxrisk.flower.federation.Federation` is its simulation): every simulation declares
``evaluate`` (Flower: the server's held-out set, the sites' reports), ``summary_extra`` (Flower:
its sites, its deployment) and ``remote_sites`` (:class:`~fedxrisk.engines.reporting.RunReporting`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from fedxrisk.algorithms import Algorithm
from fedxrisk.data.types import describe_positive, positive_record
from fedxrisk.engines.participation import PARTICIPATION_FILE, participation_csv
from fedxrisk.engines.validation import federated_validation
from fedxrisk.errors import RunFailure
from fedxrisk.metrics import SURVIVAL_KEYS, is_survival
from fedxrisk.outfiles import replace_atomic
from fedxrisk.run.build import Setup
from fedxrisk.run.callbacks import BestModel, Callback, EarlyStopping, LoopState, selection_callbacks
from fedxrisk.run.folder import (
    HISTORY_FIELDS,
    LAST_MODEL,
    MODEL,
    PAUC_KEYS,
    SURVIVAL_FIELDS,
    RunFolder,
    RunResult,
    json_safe,
)
from fedxrisk.run.identity import fingerprint
from fedxrisk.run.personalize import (
    deployed_headline,
    finish_personal,
    personal_fields,
    personal_row,
    save_site_models,
    site_snapshot,
)
from fedxrisk.run.privacy_outputs import (
    SITE_DATA_NOTE,
    inversion_guard,
    model_mark,
    plan_note,
    privacy_fields,
    privacy_ledger,
    privacy_row,
    privacy_summary,
    validation_release,
)


def train(
    setup: Setup, folder: RunFolder, callbacks: Sequence[Callback] = (), ckpt: dict[str, Any] | None = None
) -> RunResult:
    """Train ``setup`` (resumed from ``ckpt`` if given), evaluating every ``eval_every`` rounds and at
    the end; on a NaN/inf loss (:class:`NonFiniteLoss`) or another :class:`RunFailure` the summary records
    ``status: failed`` and the error is raised."""
    cfg, sim = setup.config, setup.simulation
    primary = sim.is_primary
    chooses = selection_callbacks(cfg.selection, cfg.resolved_monitor(), cfg.early_stopping)
    callbacks = [*chooses, *callbacks]  # selection first: later hooks see its choice
    history: list[dict[str, Any]] = list(ckpt["history"]) if ckpt else []
    best: dict[str, Any] | None = ckpt["best"] if ckpt else None
    resumed: list[int] = [*ckpt["resumed_at"], sim.round] if ckpt else []
    earlier = ckpt["wall_seconds"] if ckpt else 0.0
    saved = ckpt.get("callbacks", {}) if ckpt else {}
    for cb in callbacks:
        if cb.state_key in saved:
            cb.load_state_dict(saved[cb.state_key])
    survival = is_survival(setup.data.data)  # Harrell's C instead of AUROC: metrics.evaluate_survival
    headline = "test_cindex" if survival else "test_auroc"
    if survival:
        folder.fields = SURVIVAL_FIELDS
    if setup.privacy is not None:
        folder.fields = (*(SURVIVAL_FIELDS if survival else HISTORY_FIELDS), *privacy_fields(setup.privacy))
        folder.model_mark = model_mark(setup.privacy)
        if primary:
            print(setup.privacy.describe(), file=sys.stderr)
            if (note := plan_note(setup.privacy)) is not None:  # (K, ε) hopeless? stated up front
                print(note, file=sys.stderr)
            print(SITE_DATA_NOTE, file=sys.stderr)
    folder.fields = (*folder.fields, *personal_fields(setup))  # per-site columns of a personalized run
    start = time.perf_counter()

    def elapsed() -> float:
        return earlier + time.perf_counter() - start

    folder.write_history(history)  # drops rows evaluated after the checkpoint
    state = LoopState(cfg, folder.path, len(sim.plans), sim.round, history, primary, False, sim.global_model)
    state.positive = describe_positive(setup.data.data)
    state.site_states = site_snapshot(setup)  # selection keeps the sites' states too
    for cb in callbacks:
        cb.on_start(state)

    def evaluated(row: dict[str, Any]) -> None:
        for cb in callbacks:
            if primary or cb.all_ranks:
                cb.on_evaluation(row, state)

    release = validation_release(setup)  # under DP, choosing on validation: its Gaussian release
    guard = inversion_guard()  # a release that cannot tell the model from its inverse: warned once
    if setup.init is not None and ckpt is None:  # the starting weights' metrics
        val = federated_validation(sim, setup.problem, setup.data, release)  # collective under distributed
        row0 = _initial_row(setup) | val if primary else {"round": 0, **val}
        if primary:
            guard(val)
            history.append(row0)
            best = row0
            folder.write_history(history)
        evaluated(row0)
    failure: RunFailure | None = None
    with folder.history_rows() as append:
        try:
            while not sim.done and not state.should_stop:
                plan = sim.run_round()
                state.round = sim.round
                row: dict[str, Any] = {}
                if evaluates(cfg, sim.round, len(sim.plans)):
                    val = federated_validation(sim, setup.problem, setup.data, release)  # every rank
                    row = (
                        _evaluate_row(setup, plan, elapsed()) | val
                        if primary
                        else {"round": sim.round, **val}
                    )
                    if primary:
                        guard(val)
                        row |= personal_row(setup)
                        if setup.privacy is not None:
                            row |= privacy_row(setup.privacy, sim.round)
                        append(row)
                        history.append(row)
                        if best is None or _better(row[headline], best[headline]):
                            best = row
                    evaluated(row)
                if cfg.checkpoint_every and sim.round % cfg.checkpoint_every == 0 and not sim.done:
                    folder.save_checkpoint(_checkpoint(setup, callbacks, history, best, elapsed(), resumed))
                for cb in callbacks:
                    cb.on_round_end(row if primary else {}, state)
        except RunFailure as e:  # a NaN loss; on Flower a lost site
            failure = e
        finally:
            for cb in callbacks:
                cb.on_end(state)
    chosen = next((cb for cb in callbacks if isinstance(cb, BestModel)), None)
    stopper = next((cb for cb in callbacks if isinstance(cb, EarlyStopping)), None)
    summary = _summary(setup, history, best, elapsed(), failure)
    summary["selected"] = json_safe(selected_record(cfg, history, chosen))
    summary["below_chance"] = below_chance(summary["selected"], history[-1] if history else {})
    if summary["below_chance"] is not None:
        warnings.warn(summary["below_chance"]["warning"], stacklevel=2)
        if summary["selected"] is not None and summary["below_chance"]["of"] == "selected":
            summary["selected"]["warning"] = summary["below_chance"]["warning"]
    if stopper is not None:
        summary["early_stopping"] = {"patience": stopper.patience, "stopped_at_round": stopper.stopped_round}
    summary["resumed_at_rounds"] = resumed
    summary |= json_safe(sim.summary_extra())  # e.g. Flower's sites and deployment
    if sim.participation is not None and primary:  # who took part (docs/participation.md)
        summary["participation"] = record_participation(folder.path, sim.participation, sim.round)
    if failure is None or (failure.keeps_model and history):  # the models before the summary: it commits
        shape, labels = setup.data.data.input_shape, setup.problem.num_labels
        states = chosen.states if chosen is not None and chosen.row is not None else None
        (params, buffers), personal = finish_personal(
            setup, states
        )  # fine-tunes the sites after the global model
        if personal is not None:
            summary["personal"] = json_safe(save_site_models(setup, folder, personal))
            summary["deployed"] = json_safe(deployed_headline(summary["personal"]))
        params, buffers = (params, buffers) if primary else ({}, {})
        prep = setup.data.data.preprocessing
        if chosen is not None and chosen.params is not None:
            folder.save_model(cfg.model, shape, labels, params, buffers, LAST_MODEL, prep)
            params, buffers = chosen.params, chosen.buffers or {}
        summary["model_sha256"] = folder.save_model(cfg.model, shape, labels, params, buffers, MODEL, prep)
        # model.pt's test C-index, pooled and per site, with patient-bootstrap CIs
        if survival and primary:
            summary["test_cindex"] = json_safe(survival_summary(setup, params, buffers))
    folder.write_summary(summary)
    if failure is not None:
        raise failure
    if cfg.checkpoint_every and sim.done:  # keep the end state: the run can be extended
        folder.save_final_state(_checkpoint(setup, callbacks, history, best, elapsed(), resumed))
    folder.drop_checkpoint()
    return RunResult(summary, history, folder.path)


def record_participation(path: Any, participation: Any, rounds: int) -> dict[str, Any]:
    """Write ``participation.csv`` (the clients of each round run) and return summary.json's record."""
    text = participation_csv(participation, rounds)
    replace_atomic(path / PARTICIPATION_FILE, lambda f: f.write(text))
    return {**participation.describe(), "record": PARTICIPATION_FILE}


def evaluates(cfg: Any, rounds_done: int, total: int) -> bool:
    """Whether :func:`train` evaluates after ``rounds_done`` of ``total`` rounds: every ``eval_every``
    rounds and at the end (a Flower site learns it before the round, to send its model)."""
    return rounds_done % cfg.eval_every == 0 or rounds_done >= total


def below_chance(selected: dict[str, Any] | None, final: dict[str, Any]) -> dict[str, Any] | None:
    """The model a run writes, when it ranks worse than chance on data it may look at: said aloud and
    kept in summary.json (``below_chance``: of what, which metric, its value, the warning) — the
    selected model's own validation AUROC, else the final model's validation AUROC, else (no
    validation) its mean AUROC on the clients' own training shards. The test set is never used."""
    if selected and selected.get("selection") == "best" and str(selected.get("monitor")).startswith("site_"):
        of, metric, value = "selected", "val_auroc", selected.get("global_val_auroc")  # model.pt itself
        where = "on the validation data (the global model, model.pt; the sites' models: personal.below_chance_sites)"
    elif selected and selected.get("selection") == "best" and "auroc" in str(selected.get("monitor")):
        of, metric, value, where = (
            "selected",
            selected["monitor"],
            selected.get("value"),
            "on its own validation data",
        )
    elif _finite(final.get("val_auroc")):
        of, metric, value, where = "final", "val_auroc", final["val_auroc"], "on the validation data"
    else:
        of, metric, value = "final", "client_auroc_mean", final.get("client_auroc_mean")
        where = "on the clients' own training data (mean over clients; no validation data)"
    if not _finite(value) or not value < 0.5:
        return None
    warning = (
        f"the {'selected' if of == 'selected' else 'final'} model's {metric} is {value:.3f} < 0.5 {where}: it "
        "ranks worse than chance (an inverted model); check the step size, the privacy noise and the positive class"
    )
    return {"of": of, "metric": metric, "value": value, "warning": warning}


def _finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


ORACLE_NOTE = "chosen on the test set: an optimistic bound for comparison, not a result; see 'selected'"


def selected_record(cfg, history: list[dict[str, Any]], chosen: BestModel | None) -> dict[str, Any] | None:
    """summary.json ``selected``: the model in ``model.pt``, its round, monitor value and test metrics."""
    monitor = cfg.resolved_monitor()
    fallback = chosen is not None and chosen.row is None  # no finite validation value: the last model
    row = chosen.row if chosen is not None and chosen.row is not None else (history[-1] if history else None)
    if row is None:
        return None
    keys = ("test_auroc", "test_ap", *PAUC_KEYS, "test_auroc_per_label", "test_ap_per_label", "test_cindex")
    return {
        "selection": "last" if chosen is None or fallback else "best",
        "round": row["round"],
        "monitor": monitor,
        "value": row.get(monitor, math.nan),
        **{k: row[k] for k in keys if k in row},
        **({"note": f"no finite {monitor}: the last model"} if fallback else {}),
        **({"global_val_auroc": row.get("val_auroc", math.nan)} if monitor.startswith("site_") else {}),
    }


def _checkpoint(setup: Setup, callbacks, history, best, wall: float, resumed: list[int]) -> dict[str, Any]:
    """What a resume needs (a collective under the distributed engine: every rank calls it)."""
    simulation = setup.simulation.state_dict()
    kept = {cb.state_key: cb.state_dict() for cb in callbacks if cb.state_dict()}
    return {
        "config": setup.config.to_dict(),
        "config_sha256": fingerprint(setup.config.to_dict()),
        "simulation": simulation,
        "history": history,
        "best": best,
        "wall_seconds": wall,
        "resumed_at": resumed,
        "torch_version": str(torch.__version__),
        **({"callbacks": kept} if kept else {}),
        **(
            {"privacy_ledger": privacy_ledger(setup.privacy, setup.simulation.round)} if setup.privacy else {}
        ),
    }


def _better(new: float, old: float) -> bool:
    return not math.isnan(new) and (math.isnan(old) or new > old)


def _initial_row(setup: Setup) -> dict[str, Any]:
    """Round 0: the metrics of the starting model, before any training step."""
    sim, first = setup.simulation, setup.simulation.plans[0]
    params, buffers = sim.global_model()
    metrics = sim.evaluate(params, buffers)
    return {
        "round": 0, "step": 0, "stage": first.stage, "lr": first.lr, "train_loss": math.nan, **metrics,
        "bytes_up_per_client": 0, "bytes_down_per_client": 0, "wall_seconds": 0.0,
    }  # fmt: skip


def _evaluate_row(setup: Setup, plan, wall: float) -> dict[str, Any]:
    sim = setup.simulation
    metrics = _metrics(setup, *sim.global_model())
    return {
        "round": sim.round,
        "step": plan.first_step + plan.window,
        "stage": plan.stage,
        "lr": plan.lr,
        "train_loss": sim.train_loss(),
        **metrics,
        "bytes_up_per_client": sim.ledger.total_up,
        "bytes_down_per_client": sim.ledger.total_down,
        "wall_seconds": round(wall, 4),
    }


def _metrics(setup: Setup, params, buffers) -> dict[str, Any]:
    """Test and per-client metrics of the global model, as the simulation evaluates it: on the
    run's data in process; on Flower, the server's held-out set and the sites' own AUROCs."""
    return setup.simulation.evaluate(params, buffers)


def _summary(setup: Setup, history, best, wall: float, failure: Exception | None) -> dict[str, Any]:
    cfg, sim = setup.config, setup.simulation
    final = history[-1] if history else {}
    keys = ("test_auroc", "test_ap", *PAUC_KEYS, "client_auroc_mean", "client_auroc_std", "train_loss")
    keys = (*keys, "round") if "test_cindex" not in final else (*SURVIVAL_KEYS, "train_loss", "round")
    headline = "test_cindex" if "test_cindex" in final else "test_auroc"
    return json_safe(
        {
            "status": "failed" if failure else "completed",
            "error": str(failure) if failure else None,
            "algorithm": cfg.algorithm,
            "dataset": cfg.dataset,
            "engine": cfg.engine,
            "num_clients": cfg.clients,
            "rounds": sim.round,
            "local_steps": cfg.resolved_local_steps(),
            "seed": cfg.seed,
            "final": {k: final.get(k, math.nan) for k in keys}
            | {k: final[k] for k in ("test_auroc_per_label", "test_ap_per_label") if k in final},
            "label_names": list(setup.data.data.label_names) or None,
            "positive_class": positive_record(setup.data.data),
            "test_oracle": {
                "note": ORACLE_NOTE,
                headline: best[headline],
                "round": best["round"],
                **_best_of(history, PAUC_KEYS if headline == "test_auroc" else ()),
            }
            if best
            else None,  # fmt: skip
            "communication": sim.ledger.summary(),
            "wall_seconds": round(wall, 3),
            "data": {
                "train_samples": len(setup.data.data.y_train),
                "train_pos_ratio": setup.data.data.pos_ratio,
                "test_samples": len(setup.data.data.y_test),
                "client_counts": setup.data.client_counts(),
                "client_sites": setup.data.client_sites(),  # client k is this site (None: not one site each)
                "stream": setup.stream.summary() if setup.stream is not None else None,
            },
            "hyperparameters": _hparams(setup.algorithm),
            **({"init": setup.init} if setup.init is not None else {}),
            **({"privacy": privacy_summary(setup.privacy, sim.round)} if setup.privacy is not None else {}),
            "config": cfg.to_dict(),
            "config_sha256": fingerprint(cfg.to_dict()),
            "torch_version": torch.__version__,
        }
    )


def survival_summary(setup: Setup, params, buffers) -> dict[str, Any]:
    """summary.json ``test_cindex``: Harrell's C of the saved model's test risk scores, pooled, per site
    and the mean over sites, with patient-bootstrap intervals (:func:`fedxrisk.stats.survival.cindex_report`,
    resampling seed 0: ``fedxrisk evaluate RUN`` with its default ``--seed`` reproduces it)."""
    from fedxrisk.metrics import predict
    from fedxrisk.stats.survival import cindex_report

    d = setup.data.data
    scores = predict(setup.problem, params, buffers, d.x_test)
    return cindex_report(
        d.groups_test["time"], d.y_test.numpy(), scores, d.groups_test.get("source"), d.source_names, seed=0
    )  # fmt: skip


def _hparams(alg: Algorithm) -> dict[str, Any]:
    return {f.name: getattr(alg, f.name) for f in dataclasses.fields(alg) if f.name != "problem"}  # type: ignore[arg-type]


def _best_of(history, keys) -> dict[str, float]:
    """The best value of each metric over the evaluations (rounds may differ from best.round)."""
    values = {k: [r[k] for r in history if not math.isnan(r.get(k, math.nan))] for k in keys}
    return {k: max(v, default=math.nan) for k, v in values.items()}
