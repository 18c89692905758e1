"""What a DP run writes about its privacy (issue 30): ε per evaluation with its neighbouring
relation, the ledger in checkpoints and summary.json, the "not private" mark of the reproducible
test mode, and the note that the folder holds per-site data no ε covers.

A DP run folder is not a release: checkpoints (``last.pt``, ``final_state.pt``) keep every
client's state (control variates, local models: resuming needs them), ``summary.json`` the
per-client counts, ``history.csv`` per-client metric spreads. Only ``model.pt`` (the global
model) is covered by ε; the folder says so (:data:`SITE_DATA_NOTE`, summary ``privacy.folder``).
"""

from __future__ import annotations

from typing import Any

SITE_DATA_NOTE = (
    "differential privacy: this run folder contains non-private site data (per-client state in "
    "checkpoints, per-client counts and metrics); only model.pt is covered by ε — share model.pt alone"
)


def privacy_block(
    level: str, epsilon: float, delta: float, relation: str, epsilon_replace_one: float | None,
    clip: float, noise_multiplier: float, target_epsilon: float | None, q: float, sampling: str,
    ledger: list[Any], private: bool, validation: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """summary.json's ``privacy`` block, the same keys on every engine and on Flower
    (flower/private.ServerDP adds who clips and who adds the noise). ``epsilon_replace_one``:
    None where it equals ``epsilon`` (fixed sampling); ``validation``: the release's summary."""
    return {
        "level": level, "epsilon": epsilon, "delta": delta, "relation": relation, "unit": unit_of(level),
        **({"epsilon_replace_one": epsilon_replace_one} if epsilon_replace_one is not None else {}),
        "clip": clip, "noise_multiplier": noise_multiplier, "target_epsilon": target_epsilon,
        "sampling_rate": q, "sampling": sampling,
        "accountant": "RDP (dp-accounting) over the ledger; replace-one: PLD",
        "ledger": [s.to_dict() for s in ledger],
        "noise": "secret" if private else "reproducible test mode: NOT PRIVATE",
        "private": private,
        **({"validation": validation} if validation is not None else {}),
    }  # fmt: skip


def unit_of(level: str) -> str:
    """What one DP guarantee protects at ``level``."""
    return "client (all its records)" if level == "client" else "record"


NOT_PRIVATE = "NOT PRIVATE: reproducible test noise (privacy.reproducible_noise)"  # in model.pt, history.csv


def privacy_fields(plan: Any) -> tuple[str, ...]:
    """history.csv columns of a DP run (a run releasing validation: the noise's SD on val_auroc; the
    test mode adds ``privacy``, :data:`NOT_PRIVATE` on every row)."""
    fields = ("epsilon", "epsilon_replace_one") if plan.differs else ("epsilon",)
    fields = ("val_auroc_noise_sd", *fields) if plan.validation is not None else fields
    return fields if plan.private else (*fields, "privacy")


def privacy_row(plan: Any, rounds: int) -> dict[str, Any]:
    """ε after ``rounds`` rounds (under ``plan.relation``) and, where it differs, the replace-one ε."""
    row: dict[str, Any] = {"epsilon": plan.epsilon(rounds)}
    if plan.differs:
        row["epsilon_replace_one"] = plan.replace_epsilon(rounds)
    return row if plan.private else row | {"privacy": NOT_PRIVATE}


def model_mark(plan: Any) -> str | None:
    """What ``model.pt`` (and every model a run folder holds) records under ``privacy``: the test
    mode's :data:`NOT_PRIVATE`; nothing for a run without DP or with secret noise."""
    return None if plan is None or plan.private else NOT_PRIVATE


def privacy_ledger(plan: Any, rounds: int) -> list[dict[str, Any]]:
    """The ledger of the rounds run so far, as a checkpoint keeps it (not secret)."""
    return [s.to_dict() for s in plan.ledger(rounds)]


def privacy_summary(plan: Any, rounds: int) -> dict[str, Any]:
    """summary.json ``privacy``: the plan's summary, the folder's note."""
    return {**plan.summary(rounds), "folder": SITE_DATA_NOTE}


def validation_release(setup: Any) -> Any:
    """The :class:`~fedxrisk.engines.privacy.validation.ValidationRelease` of a DP run choosing on
    validation (its noise from the simulation's source), else None (validation computed in clear)."""
    plan = setup.privacy
    if plan is None or plan.validation is None:
        return None
    from fedxrisk.engines.privacy.validation import ValidationRelease, run_source

    if isinstance(plan.validation, ValidationRelease):  # Flower's server: built on its aggregator's source
        return plan.validation
    return ValidationRelease(plan.validation, run_source(setup.simulation), setup.data.num_clients)


HOPELESS_RATIO = 1.0  # client level: noise SD per coordinate of the mean update ≥ this × C warns


def update_noise_ratio(noise_multiplier: float, q: float, num_clients: int) -> float:
    """σ/(q·K): the SD per coordinate of the noise on the client-level mean update, σC/(qK)
    (DP-FedAvg, McMahan et al. 2018, the noised sum over the expected qK participants), over the clip C —
    the largest norm the mean of clipped updates can have. Public: σ, q and K are."""
    return noise_multiplier / (q * num_clients)


def update_noise_note(
    level: str, noise_multiplier: float, q: float, num_clients: int, clip: float
) -> str | None:
    """The line a client-level run (and ``fedxrisk check``) states up front: the ratio of
    :func:`update_noise_ratio`, with a warning at ≥ :data:`HOPELESS_RATIO`; None at instance level."""
    if level != "client":
        return None
    ratio = update_noise_ratio(noise_multiplier, q, num_clients)
    line = (
        f"client-level DP: the noise on the mean update has SD σC/(qK) = {ratio * clip:.3g} per coordinate, "
        f"{ratio:.3g}× the clip C = {clip:g} (σ = {noise_multiplier:.4g}, qK = {q * num_clients:.3g} sites a round)"
    )
    if ratio >= HOPELESS_RATIO:
        line += (
            f"; WARNING: at ≥ {HOPELESS_RATIO:g}× C the noise on every coordinate exceeds the norm of any "
            "mean update, so the model will learn little: more sites, a larger privacy.target_epsilon "
            "(or smaller noise_multiplier) or fewer rounds"
        )
    return line


def plan_note(plan: Any) -> str | None:
    """:func:`update_noise_note` of a :class:`~fedxrisk.run.privacy.PrivacyPlan` (or of Flower's
    ``ServerDP``, which holds one)."""
    plan = getattr(plan, "plan", plan)
    return update_noise_note(plan.level, plan.noise_multiplier, plan.q, plan.num_clients, plan.clip)


def inversion_guard() -> Any:
    """A run's check of each released validation (``val_*`` with ``val_auroc_noise_sd``): the first
    :func:`~fedxrisk.engines.privacy.validation.inversion_warning` goes to stderr, once per run."""
    import math
    import sys

    from fedxrisk.engines.privacy.validation import inversion_warning

    said: list[str] = []

    def check(val: dict[str, Any]) -> None:
        sd = val.get("val_auroc_noise_sd", math.nan)
        if not said and (line := inversion_warning(val.get("val_auroc", math.nan), sd)) is not None:
            said.append(line)
            print(f"{line} (said once per run)", file=sys.stderr)

    return check
