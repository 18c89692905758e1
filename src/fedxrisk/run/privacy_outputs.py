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


def privacy_fields(plan: Any) -> tuple[str, ...]:
    """history.csv columns of a DP run."""
    return ("epsilon", "epsilon_replace_one") if plan.differs else ("epsilon",)


def privacy_row(plan: Any, rounds: int) -> dict[str, float]:
    """ε after ``rounds`` rounds (under ``plan.relation``) and, where it differs, the replace-one ε."""
    row = {"epsilon": plan.epsilon(rounds)}
    if plan.differs:
        row["epsilon_replace_one"] = plan.replace_epsilon(rounds)
    return row


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
    return ValidationRelease(plan.validation, run_source(setup.simulation))
