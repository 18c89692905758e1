"""The old home of the round schedule, kept for imports: it lives in :mod:`fedxrisk.schedule`
(outside this package, so that config checks build it without importing torch)."""

from fedxrisk.schedule import RoundPlan, Schedule, Stage

__all__ = ["RoundPlan", "Schedule", "Stage"]
