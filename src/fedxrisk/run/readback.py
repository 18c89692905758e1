"""Reading back what a run wrote: ``summary.json`` and ``history.csv``, each damaged file refused
in one line naming it (plots, compare and resume read runs through these)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError


def parse_cell(text: str) -> Any:
    """A history cell: int, float or text; empty and "nan" cells are ``math.nan`` itself (one object,
    so rows with NaN metrics, e.g. ``val_*`` without validation data, compare equal)."""
    if text in ("", "nan"):
        return math.nan
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_summary(path: Path) -> dict[str, Any]:
    """``summary.json`` as a dict with a ``config`` dict; one line naming the file otherwise."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable summary ({str(e).splitlines()[0]})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
        raise ConfigError(f"{path}: not a fedxrisk summary (expected a JSON object with a 'config' object)")
    return summary


HISTORY_NUMBERS = (
    "round",
    "test_auroc",
    "bytes_up_per_client",
    "bytes_down_per_client",
)  # read by plots and compare


def read_history(path: Path) -> list[dict[str, Any]]:
    """``history.csv`` rows; a damaged file is refused with one line naming the file and line."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{path}: not a readable history ({str(e).splitlines()[0]})") from None
    numbers = HISTORY_NUMBERS  # a survival run's history has the C-index instead (run/folder.py)
    if "test_cindex" in header:
        numbers = tuple("test_cindex" if c == "test_auroc" else c for c in HISTORY_NUMBERS)
    missing = [c for c in numbers if c not in header]
    if missing:
        raise ConfigError(f"{path}: not a fedxrisk history (no column(s) {missing})")
    history = []
    for line, row in enumerate(rows, start=2):
        if None in row or None in row.values():
            count = len(header) + len(row.get(None) or []) - sum(v is None for v in row.values())
            raise ConfigError(f"{path} line {line}: {count} field(s), the header has {len(header)}")
        parsed = {k: parse_cell(v) for k, v in row.items()}
        bad = [c for c in numbers if not isinstance(parsed[c], (int, float))]
        if bad:
            raise ConfigError(f"{path} line {line}: {bad[0]} = {row[bad[0]]!r} is not a number")
        history.append(parsed)
    return history
