"""What a tune folder holds, written from plain records (no optuna, no torch).

::

    TUNE/tune.json          the settings (algorithm, monitor, study, storage, space); marks the folder
    TUNE/study.journal      the default Optuna storage (JournalStorage): rerun the command to resume
    TUNE/trials/NNNN/       one normal run folder per trial, plus trial.json (its state, value, params)
    TUNE/trials.csv         every trial: number, state, value, parameters, folder
    TUNE/best_config.toml   the best trial's config: ``fedxrisk run --config TUNE/best_config.toml``
    TUNE/best.json          the best trial's number, value and parameters
    TUNE/history.png, importances.png   Optuna's optimization history and parameter importances
    TUNE/confirm/seedS/     with ``--confirm-seeds``: the best config rerun on seed S; confirm.json
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError
from fedxrisk.outfiles import check_creatable, refuse_symlink
from fedxrisk.run.folder import replace_atomic, write_json_atomic

MARKER = "tune.json"
OWN = ("tune.json", "study.journal", "trials", "trials.csv", "best_config.toml", "best.json",
       "history.png", "importances.png", "confirm", "confirm.json")  # fmt: skip


@dataclass
class TrialRecord:
    """One trial as the outputs show it."""

    number: int
    state: str  # complete | pruned | failed | running | waiting
    value: float | None
    params: dict[str, Any]
    folder: str
    round: int | None = None  # pruned: the round it stopped at
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def check_tune_dir(out: Path, settings: dict[str, Any]) -> bool:
    """``out`` is new, empty, or a tune folder of the same algorithm and monitor (then: True, resume).

    Any other non-empty folder is refused, so no run folder or user file is mixed into a study.
    """
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"--out {out} is a dangling symbolic link; choose another folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if not out.is_dir():
        check_creatable(out)  # /proc/…, below a file, a read-only disk: one line before any work
        return False
    if not any(out.iterdir()):
        return False
    refuse_links(out)
    marker = out / MARKER
    if not marker.exists():
        names = ", ".join(sorted(p.name for p in out.iterdir())[:5])
        raise ConfigError(
            f"--out {out} is not empty and holds no fedxrisk tune ({names}); choose a new or empty folder"
        )
    old = read_marker(out)
    for key in ("algorithm", "monitor", "dataset"):
        if old.get(key) != settings.get(key):
            raise ConfigError(
                f"{out} holds a tune of {key} {old.get(key)!r}, not {settings.get(key)!r}; choose another --out"
            )
    if "space" in old and old["space"] != settings.get("space"):  # one study searches one space
        raise ConfigError(
            f"{out} holds a tune over another search space ({_space_text(old['space'])}; now "
            f"{_space_text(settings.get('space') or {})}); rerun with its --space, or choose another --out"
        )
    return True


def _space_text(space: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {p['low']:g}..{p['high']:g}{' log' if p.get('log') else ''}" for k, p in space.items()
    )


def refuse_links(out: Path) -> None:
    """No file or folder a tune writes (nor a trial or confirmation folder) may be a symbolic link:
    a link would send the journal, a plot or a whole trial to a file outside ``out``."""
    for name in OWN:
        refuse_symlink(out / name)
    for sub in ("trials", "confirm"):
        if (out / sub).is_dir():
            for p in (out / sub).iterdir():
                refuse_symlink(p)


def read_marker(out: Path) -> dict[str, Any]:
    """``tune.json`` as a dict, or one line saying it is damaged."""
    try:
        info = json.loads((out / MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(
            f"{out / MARKER} is unreadable ({type(e).__name__}); it marks a tune folder: "
            "restore it or choose another --out"
        ) from None
    if not isinstance(info, dict):
        raise ConfigError(f"{out / MARKER} is not a tune folder's settings; choose another --out")
    return info


def start_tune_dir(out: Path, settings: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists():  # first: a second process joining sees a tune folder
        write_json_atomic(out / MARKER, settings)
    (out / "trials").mkdir(exist_ok=True)


def write_trial_json(folder: Path, record: TrialRecord) -> None:
    """``trial.json`` in a trial's run folder: pruned or failed trials say so there."""
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "trial.json", _jsonable(record))


def _jsonable(r: TrialRecord) -> dict[str, Any]:
    value = r.value if r.value is not None and math.isfinite(r.value) else None
    return {"number": r.number, "state": r.state, "value": value, "params": r.params, "round": r.round,
            "folder": r.folder, "note": r.note}  # fmt: skip


def write_trials_csv(path: Path, records: list[TrialRecord]) -> None:
    names = sorted({k for r in records for k in r.params})
    header = ["number", "state", "value", *names, "pruned_at_round", "folder", "note"]

    def write(f) -> None:
        w = csv.writer(f)
        w.writerow(header)
        for r in records:
            value = "" if r.value is None else repr(r.value)
            params = [r.params.get(k, "") for k in names]
            w.writerow(
                [r.number, r.state, value, *params, "" if r.round is None else r.round, r.folder, r.note]
            )

    replace_atomic(path, write)


def best_record(records: list[TrialRecord]) -> TrialRecord | None:
    done = [r for r in records if r.state == "complete" and r.value is not None and math.isfinite(r.value)]
    return max(done, key=lambda r: (r.value, -r.number)) if done else None


def table_rows(records: list[TrialRecord], best: TrialRecord | None) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the terminal table (best trial marked with ``*``)."""
    names = sorted({k for r in records for k in r.params})
    rows = []
    for r in records:
        value = "" if r.value is None or not math.isfinite(r.value) else f"{r.value:.4f}"
        state = r.state + (f" @{r.round}" if r.state == "pruned" and r.round is not None else "")
        mark = "*" if best is not None and r.number == best.number else ""
        rows.append([f"{r.number}{mark}", state, value, *(_fmt(r.params.get(k)) for k in names)])
    return ["trial", "state", "value", *names], rows


def _fmt(v: Any) -> str:
    return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def confirm_summary(metric: str, by_seed: dict[int, float]) -> dict[str, Any]:
    """Mean ± sample standard deviation of the test metric over the confirmation seeds."""
    values = list(by_seed.values())
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"metric": metric, "by_seed": {str(k): v for k, v in by_seed.items()},
            "mean": statistics.fmean(values), "std": std, "n": len(values)}  # fmt: skip


def write_best(out: Path, best: TrialRecord, monitor: str) -> None:
    """``best_config.toml`` (the trial's own config.toml) and ``best.json``."""
    source = out / best.folder / "config.toml"
    text = source.read_text()
    header = f"# best trial {best.number} of {out}: {monitor} = {best.value:.6g}\n"
    replace_atomic(out / "best_config.toml", lambda f: f.write(header + text))
    write_json_atomic(
        out / "best.json", {**_jsonable(best), "monitor": monitor, "warning": best_warning(best, monitor)}
    )


def best_warning(best: TrialRecord, monitor: str) -> str | None:
    """A best trial still below chance on validation (every trial inverted) is said, not crowned."""
    if "auroc" not in monitor or best.value is None or not best.value < 0.5:
        return None
    return (
        f"the best trial's {monitor} is {best.value:.3f} < 0.5: every trial ranks worse than chance on "
        "validation (an inverted model); widen --space, check the positive class and the data"
    )
