"""A run's identity: the sha256 of its config (in checkpoint.pt and summary.json) and of its model.pt.

``--resume`` compares the checkpoint's config with ``config.toml``; ``evaluate`` and
``predict`` compare ``model.pt`` with the summary's ``model_sha256``. No torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError

SUMMARY = "summary.json"
MODEL = "model.pt"


def fingerprint(config: Mapping[str, Any]) -> str:
    """sha256 of a config dict (``RunConfig.to_dict()``) as canonical JSON: the run's identity."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def same_config(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two config dicts are equal once both went through JSON (tuples and lists alike)."""
    return json.loads(json.dumps(a, default=str)) == json.loads(json.dumps(b, default=str))


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    a, b = json.loads(json.dumps(a, default=str)), json.loads(json.dumps(b, default=str))
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def config_difference(a: Mapping[str, Any], b: Mapping[str, Any], limit: int = 4) -> str:
    """``clients: 8 vs 4, seed: 0 vs 1`` for the keys whose values differ."""
    keys = differing_keys(a, b)
    a, b = json.loads(json.dumps(a, default=str)), json.loads(json.dumps(b, default=str))
    shown = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys[:limit])
    return shown + (", …" if len(keys) > limit else "")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_model_identity(run_dir: str | Path) -> None:
    """Refuse a ``model.pt`` that is not the one the run wrote (its sha256 is in summary.json)."""
    folder = Path(run_dir)
    try:
        expected = json.loads((folder / SUMMARY).read_text()).get("model_sha256")
    except (OSError, ValueError, AttributeError):
        return  # no readable summary: the caller reports it
    if expected and (folder / MODEL).is_file() and file_sha256(folder / MODEL) != expected:
        raise ConfigError(
            f"{folder / MODEL} is not the model this run wrote (its sha256 differs from summary.json's "
            "model_sha256); put the run's own model.pt back, or use the run folder the model came from"
        )


def check_config_identity(run_dir: str | Path, config: Mapping[str, Any]) -> None:
    """Refuse a ``config.toml`` edited after the run (``config``: it as read, ``RunConfig.to_dict()``):
    the model was built from the summary's config, another dataset or model would not fit it."""
    folder = Path(run_dir)
    try:
        summary = json.loads((folder / SUMMARY).read_text())
        expected, recorded = summary.get("config_sha256"), summary.get("config")
    except (OSError, ValueError, AttributeError):
        return  # no readable summary: the caller reports it
    if expected and fingerprint(config) != expected:
        shown = config_difference(recorded, config) if isinstance(recorded, Mapping) else "it changed"
        raise ConfigError(
            f"{folder / 'config.toml'} was edited after the run ({shown}, run vs file); "
            f"restore it from {folder / SUMMARY}'s config"
        )
