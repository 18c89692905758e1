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
    """history.csv columns of a DP run (the test mode adds ``privacy``, :data:`NOT_PRIVATE` on every row)."""
    fields = ("epsilon", "epsilon_replace_one") if plan.differs else ("epsilon",)
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
