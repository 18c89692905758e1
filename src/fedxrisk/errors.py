"""Every error the command line reports, at the bottom of the package: imports nothing heavy.

The CLI catches these to print one line and exit 2 (or 1 for a failed run) without
importing torch; the modules that raise them import them from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid experiment setting; the message names the setting."""


class ConfigErrors(ConfigError):
    """Several :class:`ConfigError` one rule found at once (``errors``); the message is the first's,
    saying how many follow (``fedxrisk check`` lists each on a line of its own)."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = list(errors)
        more = (
            f" (and {len(self.errors) - 1} more: `fedxrisk check` lists them)" if len(self.errors) > 1 else ""
        )
        super().__init__(f"{self.errors[0]}{more}")


def errors_in(error: ConfigError) -> list[ConfigError]:
    """The errors ``error`` reports: a :class:`ConfigErrors`' list, else ``error`` itself."""
    return list(error.errors) if isinstance(error, ConfigErrors) else [error]


def raise_all(errors: list[ConfigError]) -> None:
    """Raise ``errors``: the one error, a :class:`ConfigErrors` holding several, nothing when empty."""
    if len(errors) > 1:
        raise ConfigErrors(errors)
    if errors:
        raise errors[0]


def first_error(read: Callable[[Any, list[ConfigError]], T], table: Any) -> T:
    """``read(table, errors)`` (a reader that collects every error), its first error raised."""
    errors: list[ConfigError] = []
    out = read(table, errors)
    if errors:
        raise errors[0]
    return out


class DataFileError(ValueError):
    """A data file is malformed; the message names the file and the expected layout."""


class MissingDataError(DataFileError, FileNotFoundError):
    """A data file or folder is missing; the message names the expected layout (``layout``, when known)."""

    layout = ""


def missing_data_dir(dataset: str, data_dir: str | None, layout: str) -> MissingDataError | None:
    """The error for a file dataset's ``data_dir`` that is unset or does not exist (None: it exists)."""
    from pathlib import Path

    if data_dir is None:
        e = MissingDataError(
            f"dataset {dataset!r} reads files: set data_dir (--data-dir DIR, or --set data.data_dir=DIR) "
            f"to a folder laid out as:\n{layout}"
        )
    elif not Path(data_dir).expanduser().exists():
        root = Path(data_dir).expanduser()
        e = MissingDataError(f"{dataset}: data_dir {str(root)!r} does not exist; expected:\n{layout}")
    else:
        return None
    e.layout = layout
    return e


class BadFileError(DataFileError):
    """A data file that cannot be decoded was met while reading samples; the message names it.

    ``detail``: what failed (the file and why); ``advice``: what to do about it mid-training,
    appended to the message (empty: none); ``reason``: the reader's own error message, when a
    reader failed. Picklable with all three, so a worker returns it whole.
    """

    def __init__(self, detail: str, advice: str = "", reason: str | None = None):
        super().__init__(f"{detail}; {advice}" if advice else detail)
        self.detail, self.advice, self.reason = detail, advice, reason


class RunFailure(RuntimeError):
    """A run cannot go on: ``run.loop.train`` records it in summary.json (``status: failed``) and
    raises it. ``keeps_model``: the last evaluated global model is sound and becomes ``model.pt``."""

    keeps_model = False


class NonFiniteLoss(RunFailure):
    """Raised when a round produces a NaN/inf loss or model; carries the round (1-based, as history.csv)."""

    def __init__(self, round_: int):
        super().__init__(f"non-finite loss or model (NaN/inf) at round {round_}; training stopped")
        self.round = round_


class DistributedError(RuntimeError):
    """A rank died, hung, or could not join; the message names the rank(s) when known."""


class OutputError(ConfigError):
    """An output that cannot or must not be written (a symlink, an input, a full or read-only disk).

    The message names the path and what is left intact; the CLI exits with status 2.
    """
