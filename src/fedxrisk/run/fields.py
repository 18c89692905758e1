"""How a :class:`~fedxrisk.run.spec.RunConfig` field is declared: :func:`setting` records its default,
config-file section, help text, command-line flag and the values it allows (:class:`Allowed`, which
:func:`fedxrisk.run.rules.declared` checks). No torch."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any, NamedTuple

SELECTIONS = ("last", "best")
PERSONAL = ("none", "bn", "head")  # fedxrisk.problem.PERSONAL (this module imports no torch)
PERSONAL_MONITORS = ("mean", "worst", "weighted")  # engines/personal.py AGGREGATES


class Allowed(NamedTuple):
    """The values a setting allows beyond its type, checked by :func:`fedxrisk.run.rules.declared`
    (``None`` passes where the type allows it): a number's bounds, or the choices — a catalogue
    table's name or the values themselves; ``note`` follows the bound in the refusal."""

    above: float | None = None  # value > above
    at_least: float | None = None  # value ≥ at_least
    below: float | None = None  # value < below
    at_most: float | None = None  # value ≤ at_most
    finite: bool = False
    choices: str | tuple[str, ...] | None = None
    note: str = ""

    def bounds(self) -> str:
        """The bounds in words: ``lie in (0, 1)``, ``lie in [0, 64]``, ``be > 0``, ``be ≥ 1``."""
        if self.below is not None:
            return f"lie in ({self.above}, {self.below})"
        if self.at_most is not None:
            return f"lie in [{self.at_least}, {self.at_most}]"
        return f"be > {self.above}" if self.above is not None else f"be ≥ {self.at_least}"


def setting(
    default: Any = MISSING,
    *,
    section: str | None,
    help: str,  # noqa: A002  (click's word for it)
    flag: str | None = None,
    short: str | None = None,
    factory: Any = MISSING,
    allowed: Allowed | None = None,
) -> Any:
    """A :class:`RunConfig` field: its default, the config table it is written in (``None``: a table
    of its own), a one-line help text, its ``fedxrisk run`` flag (``None``: ``--set`` only) and the
    values it allows (:class:`Allowed`)."""
    meta = {"section": section, "help": help, "flag": flag, "short": short, "allowed": allowed}
    return field(default=default, default_factory=factory, metadata=meta)


POSITIVE = Allowed(above=0, finite=True)
COUNT = Allowed(at_least=1)
