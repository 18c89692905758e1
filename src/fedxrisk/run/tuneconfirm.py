"""``fedxrisk tune --confirm-seeds``: the best config rerun on other seeds, test metric mean ± std.

Each seed is a normal run in ``TUNE/confirm/seedS`` (kept across reruns: a finished seed is read
back, not run again). A seed whose run stops on a NaN/inf loss is reported, not averaged:
``confirm.json`` holds the seeds that finished and names the failed ones (``failed``), so one
diverging seed never loses the others.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError
from fedxrisk.outfiles import refuse_symlink


def check_seeds(seeds: list[int] | None) -> None:
    """Distinct seeds: a repeated seed would be counted twice and shrink the std."""
    if seeds is None:
        return
    if not seeds:
        raise ConfigError("--confirm-seeds names no seed; give a comma-separated list such as 1,2,3")
    if any(s < 0 for s in seeds):
        raise ConfigError(f"--confirm-seeds: seeds must be ≥ 0, got {min(seeds)}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"--confirm-seeds repeats seed {repeated[0]}; each seed must appear once")


def _finished(folder: Path) -> dict[str, Any] | None:
    """The summary of a seed's earlier run (finished or failed), or None when there is none to reuse."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    if summary.get("status") == "failed" or (folder / "model.pt").exists():
        return summary
    return None


def confirm(best_config: Path, out: Path, seeds: list[int], metric: str = "test_auroc") -> dict[str, Any]:
    """Rerun ``best_config`` on ``seeds``; write and return ``confirm.json`` (mean ± std of ``metric``
    over the seeds that finished, ``failed``: seed → why, for the ones that did not)."""
    from fedxrisk.engines import NonFiniteLoss
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.folder import write_json_atomic
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.tuneout import confirm_summary

    check_seeds(seeds)
    cfg = load_config(best_config)
    values: dict[int, float] = {}
    failed: dict[str, str] = {}
    for seed in seeds:
        folder = out / "confirm" / f"seed{seed}"
        refuse_symlink(out / "confirm")
        refuse_symlink(folder)
        summary = _finished(folder)
        if summary is None:
            try:
                summary = run_experiment(dataclasses.replace(cfg, seed=seed), folder).summary
            except NonFiniteLoss as e:
                failed[str(seed)] = f"non-finite loss at round {e.round}"
                continue
        if summary.get("status") == "failed":
            failed[str(seed)] = str(summary.get("error") or "failed")
            continue
        selected = summary.get("selected") or {}
        values[seed] = float(selected.get(metric, summary["final"][metric]))
    result = confirm_summary(metric, values) if values else {"metric": metric, "by_seed": {}, "n": 0}
    result["failed"] = failed
    write_json_atomic(out / "confirm.json", result)
    return result
