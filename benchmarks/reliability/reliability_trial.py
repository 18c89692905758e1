"""Issue 34's trial of further bad inputs: tune, privacy, secure aggregation, Flower apps, and the
features of the other open issues ([server] optimizers, personalization, evaluate --against /
--at-specificity / --calibration, cross-site, check, survival tables, positives_per_batch).

Two tiny runs are trained once (``a`` and ``b``: a 4-feature ``.npz``, the linear model). Every
case copies them into a temporary folder (``TMP``), builds its bad input there, runs one command
(``fedxrisk …`` or ``python -m fedxrisk.flower …`` in process with click's test runner, or a
Python API call) and records the exit code, the line the user sees, and whether every file that
was in ``TMP`` is unchanged (a symbolic link's target included). Its class: ``clear`` (one
``Error:`` line, exit 2, nothing written), ``runs`` (accepted, as it should be, and its output
checked), ``unclear`` (refused, but not in one ``Error:`` line with exit 2, or something was
written), ``traceback``, ``silent`` (accepted where a refusal was due) or ``data lost``.

    python benchmarks/reliability/reliability_trial.py               # run every case, write results + table
    python benchmarks/reliability/reliability_trial.py --render-only # re-render the table from the JSON

Writes ``benchmarks/results/reliability_trial.json`` and ``…/reliability_trial.md`` (a table of
docs/reliability.md). tests/test_reliability_trial.py runs the same cases.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common import casetable  # noqa: E402
from benchmarks.common.casetable import message_cell  # noqa: E402
from benchmarks.reliability.reliability_cases import CASES, Case, make_runs  # noqa: E402

NAME = "reliability_trial"
CLASSES = ("clear", "runs", "unclear", "traceback", "silent", "data lost")


# -- running --------------------------------------------------------------------------------------------
def snapshot(folder: Path) -> dict[str, str]:
    """Every file (its sha256) and every symbolic link (its target) under ``folder``, links not followed."""
    seen: dict[str, str] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                seen[key] = "link → " + os.readlink(path)
            elif path.is_file():
                seen[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def message_of(output: str, crash: BaseException | None, tmp: Path) -> str:
    """The line the user sees: the ``Error:`` line, the first warning, or the crash."""
    if crash is not None:
        text = f"crash: {type(crash).__name__}: {crash}".splitlines()[0]
    else:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.lower().startswith(("error", "warning"))]
        text = errors[0] if errors else "(none: it succeeded)"
    return text.replace(str(tmp.resolve()), "TMP").replace(str(tmp), "TMP")


def invoke(case: Case, args: list[str] | Callable[[], object]) -> tuple[int, str, BaseException | None]:
    """Exit code, output (stdout and stderr) and the exception that escaped, if any."""
    from fedxrisk.errors import ConfigError, DataFileError

    if callable(args):  # a Python API call: a fedxrisk error is its one line
        try:
            args()
        except (ConfigError, DataFileError) as e:
            return 2, f"Error: {e}", None
        except Exception as e:
            return 1, "", e
        return 0, "", None
    from click.testing import CliRunner

    if case.command.startswith("flower"):
        from fedxrisk.flower.__main__ import main
    else:
        from fedxrisk.cli import main
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, args)
    crash = None if isinstance(result.exception, (SystemExit, type(None))) else result.exception
    return result.exit_code, result.output, crash


def classify(case: Case, code: int, message: str, kept: bool, quiet: bool, ok: bool | None) -> str:
    if message.startswith("crash:"):
        return "traceback"
    if not kept:
        return "data lost"
    if case.check is not None:
        return "runs" if code == 0 and ok else "silent" if code == 0 else "unclear"
    if code == 0:
        return "silent"
    return "clear" if code == 2 and message.startswith("Error: ") and quiet else "unclear"


def run_case(case: Case, tmp: Path, runs: Path) -> dict:
    """Copy the runs into ``tmp``, build the case, run it and classify the outcome."""
    for name in ("a", "b", "tuned"):
        shutil.copytree(runs / name, tmp / name, symlinks=True)
    shutil.copy(runs / "data.npz", tmp / "data.npz")
    args = case.build(tmp)
    before = snapshot(tmp)
    code, output, crash = invoke(case, args)
    message = message_of(output, crash, tmp)
    after = snapshot(tmp)
    kept = all(after.get(k) == v for k, v in before.items())
    # refused: nothing new, and one Error line (each case makes one mistake; a config with several
    # lists each on a line of its own, as `fedxrisk check` does, so a second line is a second mistake)
    new = set(after) - set(before)
    errors = [ln for ln in output.splitlines() if ln.lower().startswith("error")]
    quiet = not new and len(errors) <= 1
    ok = case.check(tmp) if case.check is not None and code == 0 else None
    return {"id": case.id, "new": case.new, "command": case.command, "input": case.what, "exit": code, "message": message,
            "class": classify(case, code, message, kept, quiet, ok)}  # fmt: skip


def run_all(runs: Path, cases: list[Case] = CASES) -> list[dict]:
    return casetable.run_cases(run_case, cases, runs)


def render(rows: list[dict]) -> str:
    counts = {k: sum(r["class"] == k for r in rows if r["new"]) for k in CLASSES}
    old = {k: sum(r["class"] == k for r in rows if not r["new"]) for k in CLASSES}
    lines = [
        f"New cases of this trial: {sum(r['new'] for r in rows)} — "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; the findings of issue 34 above them: {sum(not r['new'] for r in rows)} — "
        + ", ".join(f"{v} {k}" for k, v in old.items() if v)
        + ".",
        "",
        "| | command | bad input | exit | message the user sees | class |",
        "|---|---|---|---:|---|---|",
    ]
    for r in rows:
        cells = [
            "new" if r["new"] else "issue", r["command"], r["input"], str(r["exit"]), message_cell(r["message"]), r["class"]
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    casetable.main(NAME, __doc__, casetable.in_fresh_runs(make_runs, run_all), render)


if __name__ == "__main__":
    main()
