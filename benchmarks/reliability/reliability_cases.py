"""The cases of benchmarks/reliability/reliability_trial.py: each builds its bad input in ``TMP`` and returns the
command's arguments (``{tmp}`` stands for ``TMP``) or, for a Python API, a call to make."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Case:
    """``build(tmp)``: the arguments, or a zero-argument call; ``check(tmp)``: set when the input must be
    accepted (the output is then checked)."""

    id: str
    command: str
    what: str
    build: Callable[[Path], list[str] | Callable[[], object]]
    check: Callable[[Path], bool] | None = None
    new: bool = True  # False: a finding listed in issue 34; True: this trial's own


DATA = ["--dataset", "npz", "--data-dir", "{tmp}/data.npz", "--clients", "2", "--partition", "iid"]
DATA += ["--imratio", "none", "--model", "linear", "--rounds", "2", "--eval-every", "1"]
RUN = ["run", *DATA, "--stages", "1", "--batch-size", "8", "--local-steps", "2"]
TUNE = ["tune", *DATA, "--set", "algorithm.stages=1", "--set", "data.batch_size=8", "--trials", "1"]
TUNE += ["--no-prune", "-q"]


def _arrays(n_train: int = 80, n_test: int = 40, width: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.uniform(0, 1, size=(n, width)).astype(np.float32)
        out[f"x_{split}"], out[f"y_{split}"] = x, (x[:, 0] + 0.2 * x[:, 1] > 0.6).astype(np.int64)
    out["source_train"] = np.arange(n_train) % 2  # two sites: cross-site evaluates on --split train
    return out


def make_runs(root: Path) -> Path:
    """``root/data.npz`` and two finished runs on it, ``a`` and ``b`` (another seed), with validation."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    np.savez(root / "data.npz", **_arrays())
    for name, seed in (("a", "0"), ("b", "1")):
        args = [a.replace("{tmp}", str(root)) for a in RUN]
        args += ["--seed", seed, "--set", "data.validation=0.25", "--out", str(root / name), "-q"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    tuned(root)
    return root


def cli(*args: str, prepare: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    """The arguments with ``{tmp}`` replaced; ``prepare(tmp)`` lays out files first."""

    def build(tmp: Path) -> list[str]:
        if prepare:
            prepare(tmp)
        return [a.replace("{tmp}", str(tmp)) for a in args]

    return build


def run_with(*sets: str) -> Callable[[Path], list[str]]:
    return cli(*RUN, *[x for s in sets for x in ("--set", s)], "--out", "{tmp}/new", "-q")


def tune_with(*extra: str, prepare: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    return cli(*TUNE, *extra, prepare=prepare)


def tune_new(*extra: str) -> Callable[[Path], list[str]]:
    return tune_with(*extra, "--out", "{tmp}/t")


# client level needs a public class prior (the data's imratio is "none" here): each case then makes one mistake
PUBLIC_P = "privacy.pos_ratio=0.3"
PRIVATE = ("privacy.clip=1.0", "privacy.noise_multiplier=1.0", PUBLIC_P)
INSTANCE = ("privacy.level='instance'", "privacy.clip=1.0", "privacy.noise_multiplier=1.0", PUBLIC_P)


def user_folder(tmp: Path) -> None:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("my notes\n")


def a_file(tmp: Path) -> None:
    (tmp / "file").write_text("x")


def tuned(root: Path) -> None:
    """A finished tune folder ``root/tuned`` (two trials) to resume or damage."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    args = [a.replace("{tmp}", str(root)) for a in TUNE] + ["--trials", "2", "--out", str(root / "tuned")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output


def tuned_then(change: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda tmp: change(tmp / "tuned")


def link_to_user(name: str) -> Callable[[Path], None]:
    def change(t: Path) -> None:
        (t.parent / "user.txt").write_text("precious\n")
        (t / name).unlink()
        (t / name).symlink_to(t.parent / "user.txt")

    return change


def flower(*args: str, prepare: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    return cli(*args, prepare=prepare)


def app_with(*sets: str) -> Callable[[Path], list[str]]:
    return flower("new-app", "{tmp}/app", *[x for s in sets for x in ("--set", s)])


def evaluate_with(*extra: str, prepare: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    return cli("evaluate", "{tmp}/a", "--out", "{tmp}/ev", "--bootstrap", "20", "-q", *extra, prepare=prepare)


def survival(
    text: str | bytes | dict, name: str = "s.csv", **kw: str
) -> Callable[[Path], Callable[[], object]]:
    """``read_survival_table`` on a file holding ``text`` (a dict: the arrays of an ``.npz``)."""

    def build(tmp: Path) -> Callable[[], object]:
        from fedxrisk.data.readers.survival import read_survival_table

        path = tmp / name
        if isinstance(text, dict):
            np.savez(path, **text)
        else:
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return lambda: read_survival_table(path, **kw)

    return build


def _survival_csv(bad: dict[int, str] | None = None, header: str = "time,event,age") -> str:
    rows = [header] + [(bad or {}).get(i, f"{10 + i},{i % 2},{40 + i % 7}") for i in range(40)]
    return "\n".join(rows) + "\n"


def _runs_ok(tmp: Path) -> bool:
    return (tmp / "new" / "summary.json").exists()


def _summary_of(folder: str) -> Callable[[Path], None]:
    """Damage: ``folder``'s summary.json is cut short."""
    return lambda tmp: (tmp / folder / "summary.json").write_text('{"status": "compl')


def _other_dataset(tmp: Path) -> None:
    """``TMP/c``: a run of ``a``'s recipe on a 5-feature dataset."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    np.savez(tmp / "five.npz", **_arrays(width=5))
    args = [a.replace("{tmp}/data.npz", str(tmp / "five.npz")) for a in RUN] + ["--out", str(tmp / "c"), "-q"]
    assert CliRunner().invoke(main, args).exit_code == 0


SITES = ("--dataset", "npz", "--data-dir", "{tmp}/data.npz", "--split", "train")


def _no_validation(tmp: Path) -> None:
    """``TMP/a`` replaced by a run of the same recipe without validation data."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    shutil.rmtree(tmp / "a")
    args = [a.replace("{tmp}", str(tmp)) for a in RUN] + ["--out", str(tmp / "a"), "-q"]
    assert CliRunner().invoke(main, args).exit_code == 0


def _no_temperature(tmp: Path) -> bool:
    import json

    text = (tmp / "ev" / "evaluation.json").read_text()
    return (
        '"temperature": null' in text
        and "no temperature scaling" in (tmp / "ev" / "evaluation.md").read_text()
        and bool(json.loads(text))
    )


def _config(text: str, name: str = "cfg.toml") -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_text(text) and None


def _user_link(target: str, name: str) -> Callable[[Path], None]:
    """``tuned/NAME`` replaced by a link to ``TMP/TARGET`` (a user's file, a folder or nothing)."""

    def change(t: Path) -> None:
        user = t.parent / target
        if target == "user.txt":
            user.write_text("precious\n")
        elif target == "elsewhere":
            user.mkdir()
        shutil.rmtree(t / name) if (t / name).is_dir() else (t / name).unlink()
        (t / name).symlink_to(user)

    return change


def _edited_config(tmp: Path) -> None:
    path = tmp / "a" / "config.toml"
    path.write_text(path.read_text().replace('dataset = "npz"', 'dataset = "digits"'))


ISSUE = [  # the findings listed in issue 34 that one command shows
    Case("i-tune-journal-link", "tune", "`study.journal` a symlink to a user's file", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(_user_link("user.txt", "study.journal"))), new=False),
    Case("i-tune-history-link", "tune", "`history.png` a symlink to a user's file", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(_user_link("user.txt", "history.png"))), new=False),
    Case("i-tune-importances-link", "tune", "`importances.png` a symlink to a user's file", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(_user_link("user.txt", "importances.png"))), new=False),
    Case("i-tune-dangling-link", "tune", "`history.png` a dangling symlink", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(_user_link("new.png", "history.png"))), new=False),
    Case("i-tune-trials-link", "tune", "`trials/` a symlink to another folder", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(_user_link("elsewhere", "trials"))), new=False),
    Case("i-newapp-pyproject", "flower new-app", "FOLDER holds a user's `pyproject.toml`, no `--overwrite`",
         flower("new-app", "{tmp}/mine", prepare=lambda t: (user_folder(t), (t / "mine" / "pyproject.toml").write_text("[project]\n"), None)[-1]), new=False),
    Case("i-tune-storage-word", "tune", "`--storage foo`", tune_new("--storage", "foo"), new=False),
    Case("i-tune-storage-redis", "tune", "`--storage redis://localhost/0`", tune_new("--storage", "redis://localhost/0"), new=False),
    Case("i-tune-storage-sqlite-memory", "tune", "`--storage sqlite://`", tune_new("--storage", "sqlite://"), new=False),
    Case("i-tune-storage-no-folder", "tune", "`--storage sqlite:////no/such/folder/x.db`", tune_new("--storage", "sqlite:////no/such/folder/x.db"), new=False),
    Case("i-tune-storage-postgres", "tune", "`--storage postgresql://u@127.0.0.1:1/db` (nothing listens)", tune_new("--storage", "postgresql://u@127.0.0.1:1/db"), new=False),
    Case("i-tune-storage-mysql", "tune", "`--storage mysql://u@127.0.0.1:1/db` (no driver or server)", tune_new("--storage", "mysql://u@127.0.0.1:1/db"), new=False),
    Case("i-tune-grid-zero", "tune", "`--sampler grid --grid-points 0`", tune_new("--sampler", "grid", "--grid-points", "0"), new=False),
    Case("i-tune-grid-negative", "tune", "`--grid-points -3`", tune_new("--grid-points", "-3"), new=False),
    Case("i-tune-broken-marker", "tune", "`tune.json` not JSON", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(lambda t: (t / "tune.json").write_text("{not json"))), new=False),
    Case("i-tune-broken-journal", "tune", "`study.journal` damaged", tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(lambda t: (t / "study.journal").write_text('{"op_code": 0, \n garbage'))), new=False),
    Case("i-tune-space-lr-zero", "tune", "`--space lr=0:0`", tune_new("--space", "lr=0:0"), new=False),
    Case("i-tune-space-steps-zero", "tune", "`--space local_steps=0:0`", tune_new("--space", "local_steps=0:0"), new=False),
    Case("i-tune-timeout-nan", "tune", "`--timeout nan`", tune_new("--timeout", "nan"), new=False),
    Case("i-tune-confirm-twice", "tune", "`--confirm-seeds 1,2,1`", tune_new("--confirm-seeds", "1,2,1"), new=False),
    Case("i-tune-momentum", "tune", "`-a localsgdm --space momentum=0.5:1.5`", tune_new("-a", "localsgdm", "--space", "momentum=0.5:1.5"), new=False),
    Case("i-secagg-maybe", "flower new-app", "`--set secure-aggregation=maybe`", app_with("secure-aggregation=maybe"), new=False),
    Case("i-secagg-fedxl2", "flower new-app", "SecAgg+ with fedxl2", app_with("secure-aggregation=true", "algorithm=fedxl2"), new=False),
    Case("i-secagg-range-nan", "flower new-app", "`--set secure-aggregation-range=NaN`", app_with("secure-aggregation=true", "secure-aggregation-range=NaN"), new=False),
    Case("i-evaluate-out-proc", "evaluate", "`--out /proc/fedxrisk-out/x`", cli("evaluate", "{tmp}/a", "--out", "/proc/fedxrisk-out/x", "-q"), new=False),
    Case("i-predict-out-proc", "predict", "`--out /proc/fedxrisk-out/s.csv`", cli("predict", "{tmp}/a", "{tmp}/data.npz", "--out", "/proc/fedxrisk-out/s.csv", "-q"), new=False),
    Case("i-plot-out-proc", "plot", "`--out /proc/fedxrisk-out/x`", cli("plot", "{tmp}/a", "--out", "/proc/fedxrisk-out/x"), new=False),
    Case("i-evaluate-tpu", "evaluate", "`--device tpu`", evaluate_with("--device", "tpu"), new=False),
    Case("i-predict-tpu", "predict", "`--device tpu`", cli("predict", "{tmp}/a", "{tmp}/data.npz", "--out", "{tmp}/s.csv", "--device", "tpu", "-q"), new=False),
    Case("i-evaluate-edited-config", "evaluate", "a run whose config.toml was edited to another dataset", evaluate_with(prepare=_edited_config), new=False),
    Case("i-tune-selection-best", "tune", "`--set experiment.selection=best` without `data.validation` (accepted: 20 % validation)",
         tune_new("--set", "experiment.selection=best"), check=lambda tmp: (tmp / "t" / "best_config.toml").is_file(), new=False),
    Case("i-run-dash-a", "run", "`fedxrisk run -a localsgdm` (accepted)", cli(*RUN, "-a", "localsgdm", "--out", "{tmp}/new", "-q"),
         check=lambda tmp: 'algorithm = "localsgdm"' in (tmp / "new" / "config.toml").read_text(), new=False),
]  # fmt: skip

CASES: list[Case] = ISSUE + [
    # -- fedxrisk tune ------------------------------------------------------------------------------
    Case("tune-trials-zero", "tune", "`--trials 0`", tune_new("--trials", "0")),
    Case("tune-timeout-negative", "tune", "`--timeout -5`", tune_new("--timeout", "-5")),
    Case("tune-space-text", "tune", "`--space lr=abc:1`", tune_new("--space", "lr=abc:1")),
    Case("tune-space-reversed", "tune", "`--space lr=1:0.1` (low above high)", tune_new("--space", "lr=1:0.1")),
    Case("tune-space-scale", "tune", "`--space lr=0.01:1:cubic`", tune_new("--space", "lr=0.01:1:cubic")),
    Case("tune-space-unknown", "tune", "`--space nosuch=0:1`", tune_new("--space", "nosuch=0:1")),
    Case("tune-space-log-negative", "tune", "`--space lr=-1:1:log`", tune_new("--space", "lr=-1:1:log")),
    Case("tune-space-nan", "tune", "`--space lr=nan:1`", tune_new("--space", "lr=nan:1")),
    Case("tune-space-int-float", "tune", "`--space local_steps=1.5:3` (an integer key)", tune_new("--space", "local_steps=1.5:3")),
    Case("tune-space-fixed", "tune", "`--space lr=0.1` (a fixed value: accepted, trial 0 runs at 0.1)",
         tune_new("--space", "lr=0.1"), check=lambda tmp: "lr = 0.1\n" in (tmp / "t/trials/0000/config.toml").read_text()),  # fmt: skip
    Case("tune-space-twice", "tune", "`--space lr=0.1:1 --space lr=0.2:2`", tune_new("--space", "lr=0.1:1", "--space", "lr=0.2:2")),
    Case("tune-monitor-unknown", "tune", "`--monitor no_such_column`", tune_new("--monitor", "no_such_column")),
    Case("tune-confirm-negative", "tune", "`--confirm-seeds -1`", tune_new("--confirm-seeds", "-1")),
    Case("tune-confirm-text", "tune", "`--confirm-seeds a,b`", tune_new("--confirm-seeds", "a,b")),
    Case("tune-grid-huge", "tune", "`--sampler grid --grid-points 100000` over 3 keys (10¹⁵ points)", tune_new("--sampler", "grid", "--grid-points", "100000")),
    Case("tune-out-foreign", "tune", "`--out` = a user's folder (notes.txt)", tune_with("--out", "{tmp}/mine", prepare=user_folder)),
    Case("tune-out-under-file", "tune", "`--out` below a regular file", tune_with("--out", "{tmp}/file/t", prepare=a_file)),
    Case("tune-out-proc", "tune", "`--out /proc/fedxrisk-tune`", tune_with("--out", "/proc/fedxrisk-tune")),
    Case("tune-out-is-run", "tune", "`--out` = a finished run folder", tune_with("--out", "{tmp}/a")),
    Case("tune-storage-user-file", "tune", "`--storage sqlite:///` a user's text file", tune_new("--storage", "sqlite:///{tmp}/a/config.toml")),
    Case("tune-study-name-empty", "tune", "`--study-name ''`", tune_new("--study-name", "", "--storage", "sqlite:///{tmp}/s.db")),
    Case("tune-rounds-zero", "tune", "`--rounds 0`", tune_new("--rounds", "0")),
    Case("tune-algorithm-unknown", "tune", "`-a codasca,nosuch`", tune_new("-a", "codasca,nosuch")),
    Case("tune-resume-other-space", "tune", "rerun into a tune folder with another `--space`",
         tune_with("--space", "lr=0.5:2", "--trials", "3", "--out", "{tmp}/tuned")),  # fmt: skip
    Case("tune-best-config-link", "tune", "`best_config.toml` a symlink to a user's file",
         tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(link_to_user("best_config.toml")))),  # fmt: skip
    Case("tune-trials-csv-link", "tune", "`trials.csv` a symlink to a user's file",
         tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(link_to_user("trials.csv")))),  # fmt: skip
    Case("tune-best-json-link", "tune", "`best.json` a symlink to a user's file",
         tune_with("--trials", "3", "--out", "{tmp}/tuned", prepare=tuned_then(link_to_user("best.json")))),  # fmt: skip
    Case("tune-confirm-json-link", "tune", "`confirm.json` a symlink, `--confirm-seeds 1`",
         tune_with("--trials", "2", "--confirm-seeds", "1", "--out", "{tmp}/tuned",
                   prepare=tuned_then(lambda t: ((t.parent / "user.txt").write_text("precious\n"),
                                                 (t / "confirm.json").symlink_to(t.parent / "user.txt"))))),  # fmt: skip
    Case("tune-option-text", "tune", "`-o momentum=fast`", tune_new("-a", "localsgdm", "-o", "momentum=fast")),
    # -- privacy ------------------------------------------------------------------------------------
    Case("dp-delta-zero", "run", "`privacy.delta = 0`", run_with(*PRIVATE, "privacy.delta=0")),
    Case("dp-delta-one", "run", "`privacy.delta = 1`", run_with(*PRIVATE, "privacy.delta=1.0")),
    Case("dp-delta-nan", "run", "`privacy.delta = nan`", run_with(*PRIVATE, "privacy.delta=nan")),
    Case("dp-clip-zero", "run", "`privacy.clip = 0`", run_with("privacy.clip=0.0", "privacy.noise_multiplier=1.0", PUBLIC_P)),
    Case("dp-clip-inf", "run", "`privacy.clip = inf`", run_with("privacy.clip=inf", "privacy.noise_multiplier=1.0", PUBLIC_P)),
    Case("dp-clip-missing", "run", "`[privacy]` without `clip`", run_with("privacy.noise_multiplier=1.0", PUBLIC_P)),
    Case("dp-sigma-negative", "run", "`privacy.noise_multiplier = -1`", run_with("privacy.clip=1.0", "privacy.noise_multiplier=-1.0", PUBLIC_P)),
    Case("dp-sigma-inf", "run", "`privacy.noise_multiplier = inf`", run_with("privacy.clip=1.0", "privacy.noise_multiplier=inf", PUBLIC_P)),
    Case("dp-epsilon-zero", "run", "`privacy.target_epsilon = 0`", run_with("privacy.clip=1.0", "privacy.target_epsilon=0.0", PUBLIC_P)),
    Case("dp-epsilon-nan", "run", "`privacy.target_epsilon = nan`", run_with("privacy.clip=1.0", "privacy.target_epsilon=nan", PUBLIC_P)),
    Case("dp-sigma-and-epsilon", "run", "both `noise_multiplier` and `target_epsilon`", run_with(*PRIVATE, "privacy.target_epsilon=3.0")),
    Case("dp-rate-zero", "run", "`privacy.sampling_rate = 0`", run_with(*PRIVATE, "privacy.sampling_rate=0.0")),
    Case("dp-rate-above-one", "run", "`privacy.sampling_rate = 1.5`", run_with(*PRIVATE, "privacy.sampling_rate=1.5")),
    Case("dp-sampling-unknown", "run", "`privacy.sampling = 'bernoulli'`", run_with(*PRIVATE, "privacy.sampling='bernoulli'")),
    Case("dp-level-unknown", "run", "`privacy.level = 'sample'`", run_with(*PRIVATE, "privacy.level='sample'")),
    Case("dp-noise-seed-negative", "run", "`privacy.reproducible_noise = -1`", run_with(*PRIVATE, "privacy.reproducible_noise=-1")),
    Case("dp-noise-seed-text", "run", "`privacy.reproducible_noise = 'yes'`", run_with(*PRIVATE, "privacy.reproducible_noise='yes'")),
    Case("dp-noise-seed-float", "run", "`privacy.reproducible_noise = 1.5`", run_with(*PRIVATE, "privacy.reproducible_noise=1.5")),
    Case("dp-key-unknown", "run", "`privacy.sigma = 1` (not a key)", run_with(*PRIVATE, "privacy.sigma=1.0")),
    Case("dp-pos-ratio-zero", "run", "instance level, `privacy.pos_ratio = 0`", run_with(*INSTANCE, "privacy.pos_ratio=0.0")),
    Case("dp-pos-ratio-one", "run", "instance level, `privacy.pos_ratio = 1`", run_with(*INSTANCE, "privacy.pos_ratio=1.0")),
    Case("dp-client-public-p", "run", "client level, CODASCA, neither `privacy.pos_ratio` nor `data.imratio`", run_with("privacy.clip=1.0", "privacy.noise_multiplier=1.0")),
    Case("dp-instance-rate", "run", "instance level with `privacy.sampling_rate = 0.5` (a client-level key)", run_with(*INSTANCE, "privacy.sampling_rate=0.5")),
    # -- secure aggregation and Flower apps ---------------------------------------------------------
    Case("app-secagg-number", "flower new-app", "`--set secure-aggregation=2`", app_with("secure-aggregation=2")),
    Case("app-secagg-range-zero", "flower new-app", "`--set secure-aggregation-range=0`", app_with("secure-aggregation=true", "secure-aggregation-range=0")),
    Case("app-secagg-range-negative", "flower new-app", "`--set secure-aggregation-range=-5`", app_with("secure-aggregation=true", "secure-aggregation-range=-5")),
    Case("app-secagg-range-inf", "flower new-app", "`--set secure-aggregation-range=inf`", app_with("secure-aggregation=true", "secure-aggregation-range=Infinity")),
    Case("app-key-unknown", "flower new-app", "`--set no-such-key=1`", app_with("no-such-key=1")),
    Case("app-no-equals", "flower new-app", "`--set rounds`", app_with("rounds")),
    Case("app-rounds-negative", "flower new-app", "`--set rounds=-1`", app_with("rounds=-1")),
    Case("app-min-nodes-zero", "flower new-app", "`--set min-nodes=0`", app_with("min-nodes=0")),
    Case("app-round-timeout-nan", "flower new-app", "`--set round-timeout=NaN`", app_with("round-timeout=NaN")),
    Case("app-folder-is-file", "flower new-app", "FOLDER = a regular file", flower("new-app", "{tmp}/file", prepare=a_file)),
    Case("app-folder-proc", "flower new-app", "FOLDER = `/proc/fedxrisk-app`", flower("new-app", "/proc/fedxrisk-app")),
    Case("app-privacy-sigma-zero", "flower new-app", '`--set privacy={"clip": 1, "noise_multiplier": 0}`', app_with('privacy={"clip": 1.0, "noise_multiplier": 0.0}')),
    Case("fleval-existing-app", "flower evaluate", "FOLDER holds a user's `pyproject.toml`",
         flower("evaluate", "{tmp}/mine", "--model", "{tmp}/a", prepare=lambda t: (user_folder(t), (t / "mine" / "pyproject.toml").write_text("[project]\n")))),  # fmt: skip
    Case("fleval-dp-epsilon-negative", "flower evaluate", "`--dp-epsilon -1`", flower("evaluate", "{tmp}/app", "--model", "{tmp}/a", "--dp-epsilon", "-1")),
    Case("fleval-dp-epsilon-nan", "flower evaluate", "`--dp-epsilon nan`", flower("evaluate", "{tmp}/app", "--model", "{tmp}/a", "--dp-epsilon", "nan")),
    Case("fleval-dp-delta-one", "flower evaluate", "`--dp-epsilon 1 --dp-delta 1`", flower("evaluate", "{tmp}/app", "--model", "{tmp}/a", "--dp-epsilon", "1", "--dp-delta", "1")),
    Case("fleval-dp-with-against", "flower evaluate", "`--dp-epsilon 1 --against` (one model only)", flower("evaluate", "{tmp}/app", "--model", "{tmp}/a", "--against", "{tmp}/b", "--dp-epsilon", "1")),
    Case("export-sites-zero", "flower export-trial", "`--sites 0`", flower("export-trial", "digits", "--sites", "0", "--out", "{tmp}/x")),
    Case("export-dataset-unknown", "flower export-trial", "an unknown dataset", flower("export-trial", "nosuch", "--out", "{tmp}/x")),
    Case("export-out-foreign", "flower export-trial", "`--out` = a user's folder (notes.txt)", flower("export-trial", "digits", "--out", "{tmp}/mine", prepare=user_folder)),
    # -- [server] optimizers --------------------------------------------------------------------------
    Case("server-optimizer-unknown", "run", "`server.optimizer = 'rmsprop'`", run_with("server.optimizer='rmsprop'")),
    Case("server-lr-inf", "run", "`server.lr = inf`", run_with("server.optimizer='adam'", "server.lr=inf")),
    Case("server-lr-nan", "run", "`server.lr = nan`", run_with("server.optimizer='adam'", "server.lr=nan")),
    Case("server-beta1-one", "run", "`server.beta1 = 1`", run_with("server.optimizer='adam'", "server.beta1=1.0")),
    Case("server-tau-inf", "run", "`server.tau = inf`", run_with("server.optimizer='adam'", "server.tau=inf")),
    Case("server-key-unknown", "run", "`server.momentum = 0.9` (not a key)", run_with("server.optimizer='sgd'", "server.momentum=0.9")),
    Case("server-lr-text", "run", "`server.lr = 'fast'`", run_with("server.optimizer='adam'", "server.lr='fast'")),
    # -- personalization ------------------------------------------------------------------------------
    Case("personal-unknown", "run", "`model.personal = 'tail'`", run_with("model.personal='tail'")),
    Case("personal-bn-no-bn", "run", "`model.personal = 'bn'` with a linear model (no BatchNorm)", run_with("model.personal='bn'")),
    Case("finetune-negative", "run", "`algorithm.finetune_steps = -1`", run_with("algorithm.finetune_steps=-1")),
    Case("finetune-float", "run", "`algorithm.finetune_steps = 1.5`", run_with("algorithm.finetune_steps=1.5")),
    Case("ditto-lam-negative", "run", "ditto with `lam = -1`", cli(*RUN, "-a", "ditto", "-o", "lam=-1", "--out", "{tmp}/new", "-q")),
    Case("ditto-lam-nan", "run", "ditto with `lam = nan`", cli(*RUN, "-a", "ditto", "-o", "lam=nan", "--out", "{tmp}/new", "-q")),
    # -- evaluate --against / --at-specificity / --calibration ------------------------------------------
    Case("eval-spec-above-one", "evaluate", "`--at-specificity 1.5`", evaluate_with("--at-specificity", "1.5")),
    Case("eval-spec-nan", "evaluate", "`--at-specificity nan`", evaluate_with("--at-specificity", "nan")),
    Case("eval-sens-zero", "evaluate", "`--at-sensitivity 0`", evaluate_with("--at-sensitivity", "0")),
    Case("eval-against-not-run", "evaluate", "`--against` a folder that is not a run", evaluate_with("--against", "{tmp}/mine", prepare=user_folder)),
    Case("eval-against-other-data", "evaluate", "`--against` a run on another dataset (5 features)", evaluate_with("--against", "{tmp}/c", prepare=_other_dataset)),
    Case("eval-against-broken", "evaluate", "`--against` a run whose summary.json is cut short", evaluate_with("--against", "{tmp}/b", prepare=_summary_of("b"))),
    Case("eval-against-ok", "evaluate", "`--against b --at-specificity 0.9 --calibration` (accepted)", evaluate_with("--against", "{tmp}/b", "--at-specificity", "0.9", "--calibration"),
         check=lambda tmp: (tmp / "ev" / "evaluation.json").is_file()),  # fmt: skip
    Case("eval-against-self", "evaluate", "`--against` the run itself", evaluate_with("--against", "{tmp}/a")),
    Case("eval-calibration-no-val", "evaluate", "`--calibration` on a run without validation data (accepted: Brier and ECE, no temperature scaling, said)",
         evaluate_with("--calibration", prepare=_no_validation), check=_no_temperature),  # fmt: skip
    Case("eval-dp-epsilon-negative", "evaluate", "`--dp-epsilon -1`", evaluate_with("--dp-epsilon", "-1")),
    Case("eval-dp-delta-one", "evaluate", "`--dp-epsilon 1 --dp-delta 1`", evaluate_with("--dp-epsilon", "1", "--dp-delta", "1")),
    # -- cross-site and check --------------------------------------------------------------------------
    Case("cross-not-run", "cross-site", "a folder that is not a run", cli("cross-site", "{tmp}/a", "{tmp}/mine", "--out", "{tmp}/x", prepare=user_folder)),
    Case("cross-other-data", "cross-site", "runs on datasets of another shape", cli("cross-site", "{tmp}/a", "{tmp}/c", "--out", "{tmp}/x", prepare=_other_dataset)),
    Case("cross-out-foreign", "cross-site", "`--out` = a user's folder (notes.txt)", cli("cross-site", "{tmp}/a", "{tmp}/b", *SITES, "--out", "{tmp}/mine", prepare=user_folder)),
    Case("cross-no-sites", "cross-site", "the runs' test data without sites", cli("cross-site", "{tmp}/a", "{tmp}/b", "--out", "{tmp}/x")),
    Case("cross-ok", "cross-site", "two runs on the training sites (accepted: a 2 × 2 table)", cli("cross-site", "{tmp}/a", "{tmp}/b", *SITES, "--out", "{tmp}/x"),
         check=lambda tmp: (tmp / "x" / "cross_site.json").is_file()),  # fmt: skip
    Case("cross-out-link", "cross-site", "`--out` holds `cross_site.json` a symlink to a user's file, `--overwrite`",
         cli("cross-site", "{tmp}/a", "{tmp}/b", *SITES, "--out", "{tmp}/x", "--overwrite", prepare=lambda t: ((t / "x").mkdir(), (t / "user.txt").write_text("precious"), (t / "x" / "cross_site.json").symlink_to(t / "user.txt")))),  # fmt: skip
    Case("cross-broken-summary", "cross-site", "a run whose summary.json is cut short", cli("cross-site", "{tmp}/a", "{tmp}/b", "--out", "{tmp}/x", prepare=_summary_of("b"))),
    Case("cross-device-tpu", "cross-site", "`--device tpu`", cli("cross-site", "{tmp}/a", "{tmp}/b", "--out", "{tmp}/x", "--device", "tpu")),
    Case("check-missing-file", "check", "a config file that does not exist", cli("check", "{tmp}/nope.toml")),
    Case("check-binary", "check", "a binary file as the config", cli("check", "{tmp}/a/model.pt")),
    Case("check-bad-toml", "check", "a config with a TOML syntax error", cli("check", "{tmp}/cfg.toml", prepare=_config("[data\nclients = 2\n"))),
    Case("check-unknown-section", "check", "a config with an unknown section `[dta]`", cli("check", "{tmp}/cfg.toml", prepare=_config("[dta]\nclients = 2\n"))),
    Case("check-broken-summary", "check", "a run's summary.json cut short", cli("check", "{tmp}/a/summary.json", prepare=_summary_of("a"))),
    Case("check-set-no-equals", "check", "`--set data.clients`", cli("check", "--set", "data.clients")),
    # -- survival tables (Python API: read_survival_table) ----------------------------------------------
    Case("surv-nan-feature", "API survival", "`.csv`: a `nan` feature", survival(_survival_csv({3: "13,1,nan"}))),
    Case("surv-inf-feature", "API survival", "`.csv`: an `inf` feature", survival(_survival_csv({3: "13,1,inf"}))),
    Case("surv-negative-time", "API survival", "`.csv`: a negative time", survival(_survival_csv({3: "-2,1,40"}))),
    Case("surv-event-two", "API survival", "`.csv`: an event 2", survival(_survival_csv({3: "13,2,40"}))),
    Case("surv-no-event-column", "API survival", "`.csv` without an `event` column", survival(_survival_csv(header="time,status,age"))),
    Case("surv-npz-empty", "API survival", "a 0-byte `.npz`", survival(b"", "s.npz")),
    Case("surv-npz-objects", "API survival", "`.npz` of Python objects", survival({"time": np.arange(40.0), "event": np.arange(40) % 2, "age": np.array([{"a": 1}] * 40, dtype=object)}, "s.npz")),
    Case("surv-npz-text", "API survival", "`.npz` with a text feature", survival({"time": np.arange(40.0), "event": np.arange(40) % 2, "ward": np.array(["a"] * 40)}, "s.npz")),
    Case("surv-npz-lengths", "API survival", "`.npz`: 40 times, 30 feature rows", survival({"time": np.arange(40.0), "event": np.arange(40) % 2, "x": np.ones((30, 2))}, "s.npz")),
    Case("surv-npz-no-feature", "API survival", "`.npz` with only `time` and `event`", survival({"time": np.arange(40.0), "event": np.arange(40) % 2}, "s.npz")),
    Case("surv-latin1", "API survival", "a Latin-1 `.csv`", survival(_survival_csv(header="time,event,âge").encode("latin-1"))),
    # -- data.positives_per_batch -----------------------------------------------------------------------
    Case("ppb-negative", "run", "`data.positives_per_batch = -1`", run_with("data.positives_per_batch=-1")),
    Case("ppb-float", "run", "`data.positives_per_batch = 2.5`", run_with("data.positives_per_batch=2.5")),
    Case("ppb-batch", "run", "`data.positives_per_batch = 8` = the whole batch (no negatives)", run_with("data.positives_per_batch=8")),
    Case("ppb-above-batch", "run", "`data.positives_per_batch = 50` with batches of 8", run_with("data.positives_per_batch=50")),
]  # fmt: skip
assert len({c.id for c in CASES}) == len(CASES)
