"""Where the results go, and the block most benchmarks end with: measure and write the JSON, or
(``--render-only``) read the committed one back; the Markdown is then rendered from that JSON
alone, so a fresh run and a re-rendering write the same tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def write_json(path: Path, data: Any, indent: int = 1, **dump: Any) -> None:
    """``data`` as JSON (``indent`` spaces, a final newline), the format of every results file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, **dump) + "\n")


def measured(path: Path, measure: Callable[[], Any], render_only: bool, indent: int = 1, **dump: Any) -> Any:
    """The results at ``path``: ``measure()``'s, written there first, unless ``render_only``; read
    back from the file either way (what the tables are rendered from)."""
    if not render_only:
        write_json(path, measure(), indent, **dump)
    return json.loads(path.read_text())
