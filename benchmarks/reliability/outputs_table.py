"""The writing commands (compare, plot, evaluate, predict, run --resume) against bad outputs (issue 26).

Every case copies one finished tiny run into a temporary folder (``TMP``), sets up the
trap (a user's folder, a symlink, a swapped model, an edited config, a full disk
simulated by an ``ENOSPC`` from ``os.fsync``), runs the command through the CLI and
records the exit code, the line the user sees and whether every file that was there
before (and every symlink's target) is byte for byte unchanged, with no ``.tmp`` left.

    python benchmarks/reliability/outputs_table.py               # run every case, write results + table
    python benchmarks/reliability/outputs_table.py --render-only # re-render the table from the JSON

Writes ``benchmarks/results/outputs.json`` and ``benchmarks/results/outputs.md`` (the second
table of docs/reliability.md). tests/test_outputs.py runs the same cases.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common import casetable  # noqa: E402
from benchmarks.common.casetable import message_cell  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
NAME = "outputs"
TINY = dict(rounds=3, stages=1, eval_every=1, clients=2, tensorboard=False, checkpoint_every=1)
CMP = ["--set", "data.clients=2", "--set", "experiment.rounds=2", "--set", "algorithm.stages=1"]
CMP += ["--set", "algorithm.local_steps=2", "--set", "data.batch_size=16", "--seeds", "0", "-q"]


@dataclass
class Case:
    """``build(tmp)`` lays the trap in ``tmp`` (holding ``run/``, ``x.npz``) and returns the CLI arguments."""

    id: str
    command: str
    what: str
    build: Callable[[Path], list[str]]
    fault: int | None = None  # errno raised by os.fsync while the command writes


# -- traps ----------------------------------------------------------------------------------------------
def _users_folder(path: Path) -> Path:
    path.mkdir()
    (path / "curves.csv").write_text("my,own\n1,2\n")
    (path / "notes.txt").write_text("keep me\n")
    return path


def _link(link: Path, target: Path, content: str | None = "precious\n") -> None:
    if content is not None:
        target.write_text(content)
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def compare_users(tmp: Path) -> list[str]:
    return ["compare", "-a", "codasca", *CMP, "--out", str(_users_folder(tmp / "mine"))]


def compare_other(tmp: Path) -> list[str]:
    from click.testing import CliRunner

    from fedxrisk.cli import main

    CliRunner().invoke(main, ["compare", "-a", "codasca", *CMP, "--out", str(tmp / "cmp")])
    return ["compare", "-a", "localsgdm", *CMP, "--out", str(tmp / "cmp")]


def plot_users(tmp: Path) -> list[str]:
    return ["plot", str(tmp / "run"), "--out", str(_users_folder(tmp / "mine"))]


def plot_link(tmp: Path) -> list[str]:
    _link(tmp / "run" / "curves.csv", tmp / "outside.csv")
    return ["plot", str(tmp / "run")]


def plot_damaged(name: str, text: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        (tmp / "run" / name).write_text(text)
        return ["plot", str(tmp / "run"), "--out", str(tmp / "plots")]

    return build


def evaluate_dangling(tmp: Path) -> list[str]:
    _link(tmp / "run" / "roc.png", tmp / "elsewhere" / "roc.png", None)
    return ["evaluate", str(tmp / "run"), "--overwrite", "-q", "--bootstrap", "0"]


def evaluate_users(tmp: Path) -> list[str]:
    return ["evaluate", str(tmp / "run"), "--out", str(_users_folder(tmp / "mine")), "-q"]


def evaluate_swapped(tmp: Path) -> list[str]:
    (tmp / "run" / "model.pt").write_bytes((tmp / "other" / "model.pt").read_bytes())
    return ["evaluate", str(tmp / "run"), "-q", "--bootstrap", "0"]


def evaluate_full(tmp: Path) -> list[str]:
    return ["evaluate", str(tmp / "run"), "-q", "--bootstrap", "0"]


def predict(
    out: str, *extra: str, trap: Callable[[Path], None] = lambda tmp: None
) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        trap(tmp)
        return ["predict", str(tmp / "run"), str(tmp / "x.npz"), "--out", str(tmp / out), *extra, "-q"]

    return build


def resume(change: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        change(tmp / "unfinished")
        return ["run", "--resume", str(tmp / "unfinished"), "-q"]

    return build


def _edit_rounds(run: Path) -> None:
    text = (run / "config.toml").read_text()
    (run / "config.toml").write_text(text.replace("rounds = 3", "rounds = 5"))


def _foreign_checkpoint(run: Path) -> None:
    shutil.copy(run.parent / "foreign" / "checkpoint.pt", run / "checkpoint.pt")


CASES = [
    Case("compare-users-folder", "compare", "`--out` = a user's folder (curves.csv, notes.txt)", compare_users),
    Case("compare-full-disk", "compare", "disk full (ENOSPC) at the first write",
         lambda tmp: ["compare", "-a", "codasca", *CMP, "--out", str(tmp / "cmp")], errno.ENOSPC),
    Case("run-read-only", "run", "read-only folder (EROFS) at the first write",
         lambda tmp: ["run", "--rounds", "1", "-q", "--out", str(tmp / "new")], errno.EROFS),
    Case("plot-full-disk", "plot", "disk full (ENOSPC) while writing",
         lambda tmp: ["plot", str(tmp / "run")], errno.ENOSPC),
    Case("compare-another", "compare", "again into the same `--out` with another `-a`", compare_other),
    Case("plot-users-folder", "plot", "`--out` = a user's folder (curves.csv, notes.txt)", plot_users),
    Case("plot-symlink", "plot", "`RUN/curves.csv` a symlink to a file outside", plot_link),
    Case("plot-broken-summary", "plot", "`summary.json` cut short", plot_damaged("summary.json", '{"status": "comp')),
    Case("plot-broken-history", "plot", "`history.csv` with text in `test_auroc`",
         plot_damaged("history.csv", "round,test_auroc,test_ap,bytes_up_per_client,bytes_down_per_client\n1,high,0.5,1,1\n")),
    Case("evaluate-dangling", "evaluate", "`RUN/roc.png` a dangling symlink, `--overwrite`", evaluate_dangling),
    Case("evaluate-users-folder", "evaluate", "`--out` = a user's folder (curves.csv, notes.txt)", evaluate_users),
    Case("evaluate-swapped-model", "evaluate", "`model.pt` replaced by another run's", evaluate_swapped),
    Case("evaluate-full-disk", "evaluate", "disk full (ENOSPC) while writing", evaluate_full, errno.ENOSPC),
    Case("evaluate-read-only", "evaluate", "read-only folder (EROFS)", evaluate_full, errno.EROFS),
    Case(
        "predict-stale-tmp",
        "predict",
        "a stale `scores.csv.tmp` symlink to a file outside",
        predict("scores.csv", trap=lambda tmp: _link(tmp / "scores.csv.tmp", tmp / "outside.csv")),
    ),
    Case(
        "predict-out-symlink",
        "predict",
        "`--out` a symlink, `--overwrite`",
        predict("link.csv", "--overwrite", trap=lambda tmp: _link(tmp / "link.csv", tmp / "outside.csv")),
    ),
    Case("predict-out-input", "predict", "`--out` = its input, `--overwrite`", predict("x.npz", "--overwrite")),
    Case("predict-out-model", "predict", "`--out RUN/model.pt --overwrite`", predict("run/model.pt", "--overwrite")),
    Case("predict-full-disk", "predict", "disk full (ENOSPC) while writing", predict("s.csv"), errno.ENOSPC),
    Case("predict-denied", "predict", "no write permission (EACCES)", predict("s.csv"), errno.EACCES),
    Case("resume-edited-config", "run --resume", "`config.toml` edited (rounds 3 → 5)", resume(_edit_rounds)),
    Case(
        "resume-foreign-checkpoint",
        "run --resume",
        "`checkpoint.pt` of another run (localsgdm, K = 3)",
        resume(_foreign_checkpoint),
    ),
    Case("resume-full-disk", "run --resume", "disk full (ENOSPC) at the first write", resume(lambda run: None), errno.ENOSPC),
]  # fmt: skip


# -- running --------------------------------------------------------------------------------------------
def _stop_at(rounds: int):
    def stop(row, done, total):
        if done == rounds:
            raise KeyboardInterrupt

    return stop


def prepare(root: Path) -> Path:
    """``root/base``: a finished run, another finished run, an unfinished one, a foreign checkpoint, x.npz."""
    import numpy as np

    from fedxrisk.experiment import RunConfig, run_experiment

    base = root / "base"
    run_experiment(RunConfig(**TINY), base / "run")
    run_experiment(RunConfig(**{**TINY, "seed": 5}), base / "other")
    for name, changes in (("unfinished", {}), ("foreign", {"algorithm": "localsgdm", "clients": 3})):
        try:
            run_experiment(RunConfig(**{**TINY, **changes}), base / name, _stop_at(2))
        except KeyboardInterrupt:
            pass
    np.savez(base / "x.npz", x=np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32))
    return base


def snapshot(folder: Path) -> dict[str, str]:
    """Every regular file below ``folder`` → sha256 (a link is not a file: its target is checked)."""
    found = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            found[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


def message_of(result, tmp: Path) -> str:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        e = result.exception
        return f"crash: {type(e).__name__}: {e}".splitlines()[0]
    lines = [ln.strip() for ln in result.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    text = errors[0] if errors else (lines[0] if lines else "(none: it succeeded)")
    return text.replace(str(tmp.resolve()), "TMP").replace(str(tmp), "TMP")


def run_case(case: Case, base: Path, tmp: Path) -> dict:
    from click.testing import CliRunner

    from fedxrisk.cli import main

    shutil.copytree(base, tmp, dirs_exist_ok=True, symlinks=True)
    args = case.build(tmp)
    before = snapshot(tmp)
    with ExitStack() as stack:
        if case.fault is not None:
            code = case.fault

            def fail(fd):
                raise OSError(code, os.strerror(code))

            stack.enter_context(mock.patch("fedxrisk.outfiles.os.fsync", fail))
        result = CliRunner().invoke(main, args)
    after = snapshot(tmp)
    kept = all(after.get(k) == v for k, v in before.items()) and not any(k.endswith(".tmp") for k in after)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    return {
        "id": case.id,
        "command": case.command,
        "input": case.what,
        "exit": result.exit_code,
        "message": message_of(result, tmp),
        "one_line": len(lines) <= 1,
        "kept": kept,
    }


def run_all(cases: list[Case] = CASES) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        base = prepare(Path(d))
        for case in cases:
            tmp = Path(d) / case.id
            rows.append(run_case(case, base, tmp))
            print(f"{rows[-1]['exit']}  {case.id}: {rows[-1]['message']}", file=sys.stderr)
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "| command | bad output or file | exit | message the user sees | files kept |",
        "|---|---|---:|---|:---:|",
    ]
    for r in rows:
        code = message_cell(r["message"])
        lines.append(
            f"| {r['command']} | {r['input']} | {r['exit']} | {code} | {'yes' if r['kept'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    casetable.main(NAME, __doc__, run_all, render)


if __name__ == "__main__":
    main()
