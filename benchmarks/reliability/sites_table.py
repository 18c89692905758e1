"""Files from another site (issue 26): tampered models, inputs that do not match the model, bad options.

Three tiny runs are trained once (``tab``: a tabular CSV with an ``id`` column;
``npz``: 4 features in an ``.npz``; ``img``: a folder of PNG images). Every case then
copies what it needs into a temporary folder (``TMP``), damages it, runs one command
through the CLI and records the exit code, the line the user sees and whether the
files that were there are unchanged (the run folder, the input, no output left when
refused). Its class: ``clear`` (one ``Error:`` line, exit 2, nothing changed),
``runs`` (accepted, and the output checked), ``traceback``, ``silent`` (exit 0 where a
refusal was due, or a wrong output) or ``data lost``.

    python benchmarks/reliability/sites_table.py               # run every case, write results + table
    python benchmarks/reliability/sites_table.py --render-only # re-render the table from the JSON

Writes ``benchmarks/results/sites.json`` and ``benchmarks/results/sites.md`` (a table of
docs/reliability.md). tests/test_sites_table.py runs the same cases.
"""

from __future__ import annotations

import csv
import hashlib
import json
import pickle
import shutil
import struct
import sys
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common import casetable  # noqa: E402
from benchmarks.common.casetable import message_cell  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
NAME = "sites"
TINY = ["--rounds", "2", "--stages", "1", "--eval-every", "1", "--clients", "2", "--partition", "iid"]
TINY += ["--imratio", "none", "--model", "linear", "--batch-size", "8", "--local-steps", "2", "-q"]


@dataclass
class Case:
    """``build(tmp)`` lays out the damaged files in ``tmp`` (which holds copies of the runs) and
    returns the CLI arguments; ``check(tmp)`` verifies the output of a case that must run."""

    id: str
    new: bool  # False: a finding of issue 26; True: this trial's own
    command: str
    what: str
    build: Callable[[Path], list[str]]
    check: Callable[[Path], bool] | None = None  # set: the command must succeed and pass this


# -- the runs -------------------------------------------------------------------------------------------
def _png(width: int, height: int, value: int = 0) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress((b"\0" + bytes([value]) * width) * height)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _table(n: int = 120, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lines = ["id,a,b,c,label"]
    for i in range(n):
        a, b, c = rng.normal(size=3)
        lines.append(f"{1000 + i},{a * 10 + 50:.4f},{b:.4f},{c * 3:.4f},{int(a + b > 0)}")
    return "\n".join(lines) + "\n"


def make_runs(root: Path) -> Path:
    """Train the three runs into ``root`` (once); returns ``root``."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    if (root / "img" / "run" / "model.pt").exists():
        return root
    (root / "tab" / "data").mkdir(parents=True)
    (root / "tab" / "data" / "data.csv").write_text(_table())
    rng = np.random.default_rng(0)
    arrays = {f"{k}_{s}": None for k in "xy" for s in ("train", "test")}
    for s, n in (("train", 80), ("test", 40)):
        arrays[f"x_{s}"] = rng.uniform(0, 1, size=(n, 4)).astype(np.float32)
        arrays[f"y_{s}"] = (arrays[f"x_{s}"][:, 0] > 0.5).astype(np.int64)
    (root / "npz").mkdir()
    np.savez(root / "npz" / "data.npz", **arrays)
    for c, v in (("a", 30), ("b", 200)):
        (root / "img" / "data" / c).mkdir(parents=True)
        for i in range(6):
            (root / "img" / "data" / c / f"{i}.png").write_bytes(_png(4, 4, v + 3 * i))
    for name, data in (("tab", "tabular"), ("npz", "npz"), ("img", "folder")):
        where = root / name / ("data/data.npz" if name == "npz" else "data")
        if name == "npz":
            where = root / "npz" / "data.npz"
        args = ["run", "--dataset", data, "--data-dir", str(where), *TINY, "--out", str(root / name / "run")]
        if name == "img":  # two named classes: the positive one is said, never guessed
            args += ["--set", 'data.positive_classes=["b"]']
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    return root


# -- builders -------------------------------------------------------------------------------------------
def _blob(tmp: Path, run: str = "tab") -> dict:
    import torch

    return torch.load(tmp / run / "run" / "model.pt", weights_only=True)


def _save_blob(tmp: Path, blob, run: str = "tab") -> None:
    import torch

    path = tmp / run / "run" / "model.pt"
    torch.save(blob, path)
    summary = json.loads((tmp / run / "run" / "summary.json").read_text())
    summary.pop("model_sha256", None)  # the identity check of the output layer is not what is tried here
    (tmp / run / "run" / "summary.json").write_text(json.dumps(summary))


def _new_csv(tmp: Path, text: str | bytes, name: str = "new.csv") -> Path:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def predict_tab(text: str | bytes, *extra: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["predict", str(tmp / "tab" / "run"), str(_new_csv(tmp, text)), "--out",
                        str(tmp / "scores.csv"), "-q", *extra]  # fmt: skip


def model_blob(change: Callable[[dict], object], command: str = "predict") -> Callable[[Path], list[str]]:
    """The tabular run's model.pt replaced by ``change(blob)`` (its return value, or the changed blob)."""

    def build(tmp: Path) -> list[str]:
        blob = _blob(tmp)
        new = change(blob)
        _save_blob(tmp, blob if new is None else new)
        return _command(tmp, command)

    return build


def model_bytes(content: Callable[[bytes], bytes], command: str = "predict") -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        path = tmp / "tab" / "run" / "model.pt"
        path.write_bytes(content(path.read_bytes()))
        _save_blob_summary_only(tmp)
        return _command(tmp, command)

    return build


def _save_blob_summary_only(tmp: Path) -> None:
    summary = json.loads((tmp / "tab" / "run" / "summary.json").read_text())
    summary.pop("model_sha256", None)
    (tmp / "tab" / "run" / "summary.json").write_text(json.dumps(summary))


def _command(tmp: Path, command: str) -> list[str]:
    if command == "evaluate":
        return ["evaluate", str(tmp / "tab" / "run"), "--out", str(tmp / "ev"), "-q", "--bootstrap", "20"]
    return ["predict", str(tmp / "tab" / "run"), str(_new_csv(tmp, _table(5, 1))), "--out",
            str(tmp / "scores.csv"), "-q"]  # fmt: skip


class Payload:
    """A pickle that would create TMP/pwned when unpickled without ``weights_only``."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (self.target, "pwned"))


def pickled(tmp: Path, name: str = "model.pt") -> bytes:
    return pickle.dumps(Payload(tmp / "pwned"))


def init_from(make: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        source = make(tmp)
        return ["run", "--dataset", "tabular", "--data-dir", str(tmp / "tab" / "data"), *TINY,
                "--init-from", str(source), "--out", str(tmp / "new")]  # fmt: skip

    return build


def _nan_model(tmp: Path, value: float = float("nan")) -> Path:
    import torch

    blob = _blob(tmp)
    key = next(iter(blob["params"]))
    blob["params"][key][0] = value
    torch.save(blob, tmp / "w.pt")
    return tmp / "w.pt"


def _write(name: str, data: Callable[[Path], bytes]) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(data(tmp))
        return tmp / name

    return make


def predict_npz(arrays: Callable[[], dict], *extra: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        np.savez(tmp / "x.npz", **arrays())
        return ["predict", str(tmp / "npz" / "run"), str(tmp / "x.npz"), "--out", str(tmp / "scores.csv"),
                "-q", *extra]  # fmt: skip

    return build


def _x(scale: float = 1.0, n: int = 6, width: int = 4) -> np.ndarray:
    return (np.random.default_rng(3).uniform(0, 1, size=(n, width)) * scale).astype(np.float32)


def manifest(rows: list[str], *extra: str, png_names: tuple[str, ...] = ("a.png", "b.png")) -> Callable:
    """``evaluate`` of the image run on a manifest of ``rows`` (a header first)."""

    def build(tmp: Path) -> list[str]:
        (tmp / "m").mkdir(exist_ok=True)
        for i, n in enumerate(png_names):
            (tmp / "m" / n).write_bytes(_png(4, 4, 40 * i))
        (tmp / "m" / "manifest.csv").write_bytes("\n".join(rows).encode("latin-1") + b"\n")
        return ["evaluate", str(tmp / "img" / "run"), "--manifest", str(tmp / "m" / "manifest.csv"),
                "--out", str(tmp / "ev"), "-q", "--bootstrap", "20", *extra]  # fmt: skip

    return build


def train_manifest(leak: str) -> Callable[[Path], list[str]]:
    """A manifest of 12 images, 8 train and 4 test (both classes everywhere), plus the test row ``leak``."""

    def build(tmp: Path) -> list[str]:
        (tmp / "tm").mkdir()
        rows = ["path,label,split"]
        for i in range(12):
            (tmp / "tm" / f"{i}.png").write_bytes(_png(4, 4, 20 * i))
            rows.append(f"{i}.png,{i % 2},{'train' if i < 8 else 'test'}")
        rows.append(leak)
        (tmp / "tm" / "manifest.csv").write_text("\n".join(rows) + "\n")
        return [
            "run",
            "--dataset",
            "manifest",
            "--data-dir",
            str(tmp / "tm"),
            *TINY,
            "--out",
            str(tmp / "new"),
        ]

    return build


def plot_damaged(name: str, content: bytes) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        (tmp / "tab" / "run" / name).write_bytes(content)
        return ["plot", str(tmp / "tab" / "run"), "--out", str(tmp / "plots")]

    return build


def evaluate_with(*extra: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["evaluate", str(tmp / "tab" / "run"), "--out", str(tmp / "ev"), "-q", *extra]


def run_with(*extra: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["run", "--dataset", "tabular", "--data-dir", str(tmp / "tab" / "data"), *TINY,
                        *extra, "--out", str(tmp / "new")]  # fmt: skip


def tab_training(text: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        (tmp / "t2").mkdir()
        (tmp / "t2" / "data.csv").write_text(text)
        return [
            "run",
            "--dataset",
            "tabular",
            "--data-dir",
            str(tmp / "t2"),
            *TINY,
            "--out",
            str(tmp / "new"),
        ]

    return build


# -- checks of cases that must run ----------------------------------------------------------------------
def scores(tmp: Path) -> list[dict[str, str]]:
    with open(tmp / "scores.csv", newline="") as f:
        return list(csv.DictReader(f))


def same_scores_as_ordered(tmp: Path) -> bool:
    """Columns reordered: the scores equal those of the columns in training order."""
    from fedxrisk.prediction import predict

    got = [float(r["prob"]) for r in scores(tmp)]
    ordered = tmp / "ordered.csv"
    ordered.write_text(_table(5, 1))
    want = predict(tmp / "tab" / "run", ordered).probabilities[:, 0]
    return np.allclose(got, want, rtol=0, atol=1e-7)


def cells_escaped(tmp: Path) -> bool:
    rows = scores(tmp)
    return [r["id"] for r in rows] == ['\'=HYPERLINK("http://x","y")', "'+1+2", "'@SUM(A1)", "-1.5", "'-2+3"]


def id_not_a_feature(tmp: Path) -> bool:
    import torch

    prep = torch.load(tmp / "new" / "model.pt", weights_only=True).get("preprocessing", {})
    return prep.get("features") == ["a", "b"] and prep.get("id_columns") == ["PatientID"]


def formula_rows() -> str:
    ids = ['"=HYPERLINK(""http://x"",""y"")"', "+1+2", "@SUM(A1)", "-1.5", "-2+3"]
    return "id,a,b,c\n" + "".join(f"{i},50,0.1,0.2\n" for i in ids)


def _reordered() -> str:
    rows = list(csv.reader(_table(5, 1).splitlines()))
    return "\n".join(",".join([r[3], r[0], r[2], r[1]]) for r in rows) + "\n"


HEAD = "id,a,b,c\n"
ROW = "1,50,0.1,0.2\n"
MAN = ["path,label", "a.png,0", "b.png,1"]


def _damaged_blob(**changes) -> Callable[[dict], None]:
    def change(blob: dict) -> None:
        for key, value in changes.items():
            if key.startswith("prep_"):
                blob["preprocessing"][key[5:]] = value
            else:
                blob[key] = value

    return change


def _first_param(change: Callable) -> Callable[[dict], None]:
    def apply(blob: dict) -> None:
        key = next(iter(blob["params"]))
        blob["params"][key] = change(blob["params"][key])

    return apply


CASES: list[Case] = [
    # ---- the findings of issue 26 ----
    Case("model-random", False, "evaluate", "`model.pt` = random bytes",
         model_bytes(lambda b: np.random.default_rng(0).bytes(len(b)), "evaluate")),
    Case("model-pickle", False, "predict", "`model.pt` = a pickle payload (must not run)",
         lambda tmp: model_bytes(lambda b: pickled(tmp))(tmp)),
    Case("model-bare-tensor", False, "predict", "`model.pt` = a bare tensor",
         model_blob(lambda b: b["params"][next(iter(b["params"]))])),
    Case("model-wrong-shapes", False, "evaluate", "`model.pt` weights of another shape",
         model_blob(_first_param(lambda t: t[:, :2].clone()), "evaluate")),
    Case("init-from-nan", False, "run", "`--init-from` a file with NaN weights", init_from(_nan_model)),
    Case("evaluate-nan-weights", False, "evaluate", "`evaluate` of a model with NaN weights",
         model_blob(_first_param(lambda t: t * float("nan")), "evaluate")),
    Case("predict-reordered", False, "predict", "CSV columns reordered (c, id, b, a)", predict_tab(_reordered()),
         same_scores_as_ordered),
    Case("predict-nan-row", False, "predict", "a `nan` feature in row 2", predict_tab(HEAD + ROW + "2,nan,0,0\n")),
    Case("manifest-leak", False, "run", "manifest: the same image in train and test",
         train_manifest("0.png,0,test")),
    Case("eval-nan-label", False, "evaluate", "evaluation manifest with a `nan` label",
         manifest([*MAN, "a.png,nan"])),
    Case("evaluate-seed-negative", False, "evaluate", "`evaluate --seed -1`", evaluate_with("--seed", "-1")),
    Case("evaluate-batch-zero", False, "evaluate", "`evaluate --manifest … --batch-size 0`",
         manifest(MAN, "--batch-size", "0")),
    Case("plot-broken-summary", False, "plot", "`summary.json` cut short", plot_damaged("summary.json", b'{"conf')),
    Case("plot-broken-history", False, "plot", "`history.csv` of another program",
         plot_damaged("history.csv", b"x,y\n1,2\n")),
    Case("predict-latin1", False, "predict", "a Latin-1 CSV", predict_tab("id,a,b,c\n1,50,0.1,0.2\ncaf\xe9,1,2,3\n".encode("latin-1"))),
    Case("predict-npz-strings", False, "predict", "an `.npz` of strings",
         predict_npz(lambda: {"x": np.full((3, 4), "high")})),
    Case("predict-formula", False, "predict", "`id` cells `=HYPERLINK(…)`, `+1+2`, `@SUM`, `-2+3`",
         predict_tab(formula_rows()), cells_escaped),
    Case("escape-codes", False, "evaluate", "a manifest path holding terminal escape codes",
         manifest(["path,label", "a.png,0", "\x1b[2J\x1b[31mb.png,1"])),
    Case("bootstrap-huge", False, "evaluate", "`--bootstrap 100000000`", evaluate_with("--bootstrap", "100000000")),
    Case("workers-huge", False, "run", "`--set data.workers=100000`", run_with("--set", "data.workers=100000")),
    # ---- this trial's own ----
    Case("model-empty", True, "evaluate", "`model.pt` empty", model_bytes(lambda b: b"", "evaluate")),
    Case("model-truncated", True, "predict", "`model.pt` cut in half", model_bytes(lambda b: b[: len(b) // 2])),
    Case("model-json", True, "predict", "`model.pt` = JSON text", model_bytes(lambda b: b'{"model": "linear"}')),
    Case("model-no-params", True, "predict", "`model.pt` without `params`", model_blob(lambda b: b.pop("params") and None)),
    Case("model-shape-negative", True, "predict", "`input_shape` = [-3]", model_blob(_damaged_blob(input_shape=[-3]))),
    Case("model-shape-text", True, "predict", "`input_shape` = \"3\"", model_blob(_damaged_blob(input_shape="3"))),
    Case("model-labels-zero", True, "predict", "`num_labels` = 0", model_blob(_damaged_blob(num_labels=0))),
    Case("model-unknown-net", True, "predict", "`model` = \"resnet999\"", model_blob(_damaged_blob(model="resnet999"))),
    Case("model-param-list", True, "predict", "a weight stored as a list",
         model_blob(_first_param(lambda t: t.tolist()))),
    Case("model-inf-weight", True, "predict", "an `inf` weight", model_blob(_first_param(lambda t: t / 0.0))),
    Case("model-extra-weight", True, "evaluate", "an extra weight `spare.weight`",
         model_blob(lambda b: b["params"].update({"spare.weight": b["params"][next(iter(b["params"]))]}), "evaluate")),
    Case("prep-mean-length", True, "predict", "stored `mean` of 2 values for 3 features",
         model_blob(_damaged_blob(prep_mean=[0.0, 1.0]))),
    Case("prep-std-zero", True, "predict", "stored `std` = 0", model_blob(_damaged_blob(prep_std=[0.0, 1.0, 1.0]))),
    Case("prep-features-twice", True, "predict", "stored feature names `a, a, c`",
         model_blob(_damaged_blob(prep_features=["a", "a", "c"]))),
    Case("prep-not-dict", True, "predict", "stored `preprocessing` = a string",
         model_blob(lambda b: b.update(preprocessing="zscore"))),
    Case("prep-mean-nan", True, "predict", "stored `mean` with NaN",
         model_blob(_damaged_blob(prep_mean=[float("nan"), 0.0, 0.0]))),
    Case("init-from-empty", True, "run", "`--init-from` an empty file", init_from(_write("w.pt", lambda t: b""))),
    Case("init-from-inf", True, "run", "`--init-from` a file with an inf weight",
         init_from(lambda tmp: _nan_model(tmp, float("inf")))),
    Case("init-from-pickle", True, "run", "`--init-from` a pickle payload (must not run)",
         init_from(_write("w.pt", pickled))),
    Case("init-from-text", True, "run", "`--init-from` a text file", init_from(_write("w.txt", lambda t: b"hello\n"))),
    Case("predict-duplicate-column", True, "predict", "feature column `a` twice", predict_tab("id,a,a,b,c\n1,1,1,2,3\n")),
    Case("predict-short-row", True, "predict", "a row with 2 of 4 fields", predict_tab(HEAD + ROW + "2,50\n")),
    Case("predict-text-feature", True, "predict", "a feature `high`", predict_tab(HEAD + "1,high,0.1,0.2\n")),
    Case("predict-inf", True, "predict", "an `inf` feature in 3 rows", predict_tab(HEAD + ("1,inf,0,0\n" * 3) + ROW)),
    Case("predict-case", True, "predict", "columns `A,B,C` (case differs)", predict_tab("id,A,B,C\n1,50,0.1,0.2\n")),
    Case("predict-bom", True, "predict", "a CSV saved with a UTF-8 BOM", predict_tab(b"\xef\xbb\xbf" + (HEAD + ROW).encode()),
         lambda tmp: len(scores(tmp)) == 1),
    Case("predict-empty-file", True, "predict", "a 0-byte CSV", predict_tab(b"")),
    Case("predict-extra-column", True, "predict", "an extra text column `notes`", predict_tab("id,a,b,c,notes\n1,50,0.1,0.2,ok\n")),
    Case("predict-utf16", True, "predict", "a UTF-16 CSV", predict_tab((HEAD + ROW).encode("utf-16"))),
    Case("predict-patient-id", True, "predict", "id column named `patient_id`: the identifier, not a feature",
         predict_tab("patient_id,a,b,c\nP7,50,0.1,0.2\n"), lambda tmp: scores(tmp)[0]["patient_id"] == "P7"),
    Case("predict-workers-huge", True, "predict", "`--workers 999`", predict_tab(HEAD + ROW, "--workers", "999")),
    Case("predict-batch-zero", True, "predict", "`--batch-size 0`", predict_tab(HEAD + ROW, "--batch-size", "0")),
    Case("predict-scores-unknown", True, "predict", "`--scores odds`", predict_tab(HEAD + ROW, "--scores", "odds")),
    Case("npz-1d", True, "predict", "`.npz` with a 1-D `x`", predict_npz(lambda: {"x": _x()[:, 0]})),
    Case("npz-width", True, "predict", "`.npz` rows of 5 features (model: 4)", predict_npz(lambda: {"x": _x(width=5)})),
    Case("npz-nan", True, "predict", "`.npz` with NaN in rows 1 and 4",
         predict_npz(lambda: {"x": np.where(np.isin(np.arange(6), [1, 4])[:, None], np.nan, _x())})),
    Case("npz-scale", True, "predict", "`.npz` on another scale (× 1000)", predict_npz(lambda: {"x": _x(1000.0)})),
    Case("npz-complex", True, "predict", "`.npz` of complex numbers", predict_npz(lambda: {"x": _x().astype(np.complex64)})),
    Case("npz-no-x", True, "predict", "`.npz` with arrays `a`, `b` but no `x`", predict_npz(lambda: {"a": _x(), "b": _x()})),
    Case("npz-objects", True, "predict", "`.npz` of Python objects (pickled)",
         predict_npz(lambda: {"x": np.array([[1, "a", None, 2.0]] * 3, dtype=object)})),
    Case("npz-zero-bytes", True, "predict", "a 0-byte `.npz`",
         lambda tmp: (tmp / "x.npz").write_bytes(b"") and [] or ["predict", str(tmp / "npz" / "run"), str(tmp / "x.npz"),
                                                         "--out", str(tmp / "scores.csv"), "-q"]),
    Case("evaluate-batch-negative", True, "evaluate", "`--batch-size -5` with a manifest", manifest(MAN, "--batch-size", "-5")),
    Case("evaluate-workers-huge", True, "evaluate", "`--workers 1000`", evaluate_with("--workers", "1000")),
    Case("eval-inf-label", True, "evaluate", "evaluation manifest with an `inf` label", manifest([*MAN, "a.png,inf"])),
    Case("eval-label-two", True, "evaluate", "evaluation manifest with a label 2", manifest([*MAN, "a.png,2"])),
    Case("eval-latin1", True, "evaluate", "a Latin-1 evaluation manifest", manifest([*MAN, "caf\xe9.png,1"])),
    Case("eval-no-rows", True, "evaluate", "an evaluation manifest with a header only", manifest(["path,label"])),
    Case("eval-missing-image", True, "evaluate", "a manifest naming a missing image", manifest([*MAN, "gone.png,1"])),
    Case("eval-bootstrap-negative", True, "evaluate", "`--bootstrap -1`", evaluate_with("--bootstrap", "-1")),
    Case("plot-summary-null", True, "plot", "`summary.json` = `null`", plot_damaged("summary.json", b"null")),
    Case("plot-summary-latin1", True, "plot", "`summary.json` not UTF-8", plot_damaged("summary.json", b'{"a": "\xe9"}')),
    Case("plot-history-text-round", True, "plot", "`history.csv` with `round` = `two`",
         lambda tmp: _history(tmp, lambda rows: rows[1].__setitem__(0, "two"))),
    Case("plot-history-long-row", True, "plot", "`history.csv` row with an extra field",
         lambda tmp: _history(tmp, lambda rows: rows[1].append("9"))),
    Case("plot-history-binary", True, "plot", "`history.csv` = binary bytes", plot_damaged("history.csv", b"\xff\xfe\x00\x01")),
    Case("plot-history-auroc-text", True, "plot", "`history.csv` with `test_auroc` = `high`",
         lambda tmp: _history(tmp, lambda rows: rows[1].__setitem__(rows[0].index("test_auroc"), "high"))),
    Case("manifest-leak-dot", True, "run", "manifest: `0.png` in train, `./0.png` in test",
         train_manifest("./0.png,0,test")),
    Case("workers-negative", True, "run", "`--set data.workers=-3`", run_with("--set", "data.workers=-3")),
    Case("tab-only-id", True, "run", "tabular CSV whose only column besides `label` is `id`",
         tab_training("id,label\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))),
    Case("tab-patientid", True, "run", "tabular CSV with a `PatientID` column: never a feature",
         tab_training("PatientID,a,b,label\n" + "".join(f"{900 + i},{i % 7},{(i * 3) % 5},{i % 2}\n" for i in range(40))),
         id_not_a_feature),
]  # fmt: skip


def _history(tmp: Path, change: Callable[[list[list[str]]], None]) -> list[str]:
    path = tmp / "tab" / "run" / "history.csv"
    rows = list(csv.reader(path.read_text().splitlines()))
    change(rows)
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return ["plot", str(tmp / "tab" / "run"), "--out", str(tmp / "plots")]


# -- running --------------------------------------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def message_of(result, tmp: Path) -> str:
    """The line the user sees: click's ``Error: …`` line, or the crash."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        e = result.exception
        text = f"crash: {type(e).__name__}: {e}".splitlines()[0]
    else:
        lines = [ln.strip() for ln in result.output.splitlines() if ln.strip()]
        errors = [i for i, ln in enumerate(lines) if ln.lower().startswith(("error", "warning"))]
        text = lines[errors[0]] if errors else "(none: it succeeded)"
    return text.replace(str(tmp.resolve()), "TMP").replace(str(tmp), "TMP")


def classify(case: Case, exit_code: int, message: str, kept: bool, ok: bool | None) -> str:
    import unicodedata

    if message.startswith("crash:"):
        return "traceback"
    if any(unicodedata.category(ch) == "Cc" for ch in message):  # escape codes reach the terminal
        return "unclear"
    if not kept:
        return "data lost"
    if case.check is not None:
        return "runs" if exit_code == 0 and ok else "silent"
    if exit_code == 0:
        return "silent"
    return "clear" if exit_code == 2 and message.startswith("Error: ") else "unclear"


def run_case(case: Case, tmp: Path, runs: Path) -> dict:
    """Copy the runs into ``tmp``, build the case, run it through the CLI and classify the outcome."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    for name in ("tab", "npz", "img"):
        shutil.copytree(runs / name, tmp / name)
    args = case.build(tmp)
    before = _snapshot(tmp)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, args)
    message = message_of(result, tmp)
    after = _snapshot(tmp)
    written = {"scores.csv"} | {k for k in after if k.startswith(("ev/", "plots/", "new/"))}
    kept = all(after.get(k) == v for k, v in before.items()) and not (tmp / "pwned").exists()
    if case.check is None:  # refused: nothing written
        kept = kept and not (set(after) - set(before)) & written
    ok = case.check(tmp) if case.check is not None and result.exit_code == 0 else None
    return {
        "id": case.id,
        "new": case.new,
        "command": case.command,
        "input": case.what,
        "exit": result.exit_code,
        "message": message,
        "class": classify(case, result.exit_code, message, kept, ok),
    }


def run_all(runs: Path, cases: list[Case] = CASES) -> list[dict]:
    return casetable.run_cases(run_case, cases, runs)


def render(rows: list[dict]) -> str:
    counts = {k: sum(r["class"] == k for r in rows if r["new"]) for k in CLASSES}
    lines = [
        f"New cases of this trial: {sum(r['new'] for r in rows)} — "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; the findings of issue 26 above them: {sum(not r['new'] for r in rows)}.",
        "",
        "| | command | bad input | exit | message the user sees | class |",
        "|---|---|---|---:|---|---|",
    ]
    for r in rows:
        code = message_cell(r["message"])
        lines.append(
            f"| {'new' if r['new'] else 'issue'} | {r['command']} | {r['input']} | {r['exit']} | {code} | {r['class']} |"
        )
    return "\n".join(lines) + "\n"


CLASSES = ("clear", "runs", "unclear", "traceback", "silent", "data lost")


def main() -> None:
    casetable.main(NAME, __doc__, casetable.in_fresh_runs(make_runs, run_all), render)


if __name__ == "__main__":
    main()
