"""One record of the input contract, for every reader (issue 41 item 1).

For every registered file reader (``fedxrisk.data.readers.READERS``; a new reader without a
generator here fails :func:`test_every_reader_has_a_generator`): tiny data of its own format is
written, a run trains one round, and ``predict`` on that reader's own RAW training rows — the
image files, pixel arrays, CSV rows or encoded table as the user holds them, never rows derived
from the model's record — equals ``evaluate``'s scores on the reader's training split. A model
whose reader standardizes takes raw rows (scored as above) and refuses the reader's
pre-standardized rows, naming columns; an image model refuses 0–255 pixels.
"""

from __future__ import annotations

import csv
import io
import os
import pickle
import tarfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fedxrisk.data.loading import load_dataset
from fedxrisk.data.readers import READERS
from fedxrisk.data.readers.base import split_labeled
from fedxrisk.data.registry import SURVIVAL_DATASETS
from fedxrisk.evaluation.data import dataset_data
from fedxrisk.experiment import RunConfig, run_experiment
from fedxrisk.inference import InputError, load_trained
from fedxrisk.prediction import predict
from helpers import idx_bytes

Raw = Callable[[Path], Path | None]  # writes the reader's raw training rows as a predict input (None: derive)


def _pixels(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def _npz_input(root: Path, x: np.ndarray) -> Path:
    np.savez(root / "raw_rows.npz", x=x.astype(np.float32))
    return root / "raw_rows.npz"


def _cifar(root: Path, fine: bool) -> tuple[Path, Raw]:
    rng = np.random.default_rng(1)
    folder, key = ("cifar-100-python", "fine_labels") if fine else ("cifar-10-batches-py", "labels")
    train, test = _pixels(rng, 16, (3072,)), _pixels(rng, 8, (3072,))
    members = {}
    for name, data in (
        ("train" if fine else "data_batch_1", train),
        ("test" if fine else "test_batch", test),
    ):
        labels = ((np.arange(len(data)) * 13) % (100 if fine else 10)).tolist()
        members[f"{folder}/{name}"] = pickle.dumps({b"data": data, key.encode(): labels}, protocol=2)
    with tarfile.open(
        root / ("cifar-100-python.tar.gz" if fine else "cifar-10-python.tar.gz"), "w:gz"
    ) as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return root, lambda out: _npz_input(out, train.reshape(-1, 3, 32, 32) / 255.0)


def _stl10(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(2)
    images = {"train": _pixels(rng, 10, (3, 96, 96)), "test": _pixels(rng, 6, (3, 96, 96))}
    (root / "stl10_binary").mkdir()
    for split, imgs in images.items():
        (root / "stl10_binary" / f"{split}_X.bin").write_bytes(
            np.ascontiguousarray(imgs.transpose(0, 1, 3, 2)).tobytes()
        )
        (root / "stl10_binary" / f"{split}_y.bin").write_bytes(
            (1 + np.arange(len(imgs)) % 10).astype(np.uint8).tobytes()
        )
    return root, lambda out: _npz_input(out, images["train"] / 255.0)


def _idx(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(3)
    train = _pixels(rng, 12, (28, 28))
    arrays = {"train-images-idx3-ubyte": train, "train-labels-idx1-ubyte": np.arange(12) % 10,
              "t10k-images-idx3-ubyte": _pixels(rng, 6, (28, 28)), "t10k-labels-idx1-ubyte": np.arange(6) % 10}  # fmt: skip
    for name, a in arrays.items():
        (root / name).write_bytes(idx_bytes(a))
    return root, lambda out: _npz_input(out, train[:, None] / 255.0)


def _png(path: Path, rng: np.random.Generator, bright: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((rng.integers(0, 160, (8, 8, 3)) + bright).astype(np.uint8)).save(path)


def _folder(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(4)
    for c, name in enumerate(("a", "b")):
        for i in range(8):
            _png(root / name / f"{i}.png", rng, 90 * c)
    return root, lambda out: None


def _sites(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(5)
    for site in ("hospA", "hospB"):
        for c, name in enumerate(("a", "b")):
            for i in range(5):
                _png(root / site / name / f"{i}.png", rng, 90 * c)
    return root, lambda out: None


def _manifest(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(6)
    rows = ["path,label,source"]
    for i in range(16):
        _png(root / "img" / f"{i}.png", rng, 90 * (i % 2))
        rows.append(f"img/{i}.png,{'b' if i % 2 else 'a'},{'AB'[i // 8]}")
    (root / "manifest.csv").write_text("\n".join(rows) + "\n")
    return root, lambda out: None


FINDINGS = "Cardiomegaly,Edema,Consolidation,Atelectasis,Pleural Effusion"


def _chexpert(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(7)
    data = root / "CheXpert-v1.0-small"
    header = f"Path,Sex,Age,Frontal/Lateral,AP/PA,{FINDINGS}"
    for split, n in (("train", 10), ("valid", 4)):
        lines = []
        for i in range(n):
            path = f"CheXpert-v1.0-small/{split}/patient{i:05d}/study1/view1_frontal.png"
            _png(root / path, rng, 60 * (i % 2))
            lines.append(f"{path},F,50,Frontal,AP,{i % 2},{(i + 1) % 2},1,0,{i % 2}")
        data.mkdir(exist_ok=True)
        (data / f"{split}.csv").write_text("\n".join([header, *lines]) + "\n")
    return data, lambda out: None


def _chestxray_ih(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(8)
    rows = [f"path,source,patient,{FINDINGS}"]
    for i in range(24):
        _png(root / "img" / f"{i}.png", rng, 60 * (i % 2))
        rows.append(f"img/{i}.png,{'AB'[i // 12]},p{i},{i % 2},{(i + 1) % 2},1,0,{i % 2}")
    (root / "manifest.csv").write_text("\n".join(rows) + "\n")
    return root, lambda out: None


def _npz_split(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(9)
    x = rng.normal([50, 200, 5, 1000], [5, 20, 1, 100], size=(40, 4))
    y = (np.arange(40) % 2).astype(np.int64)
    np.savez(root / "data.npz", x_train=x[:28], y_train=y[:28], x_test=x[28:], y_test=y[28:])
    return root / "data.npz", lambda out: _npz_input(out, x[:28])


def _npz_xy(root: Path) -> tuple[Path, Raw]:  # ADBench's X, y: split, then standardized by the reader
    rng = np.random.default_rng(10)
    x = rng.normal([50, 200, 5, 1000], [5, 20, 1, 100], size=(60, 4)).astype(np.float32)
    y = (np.arange(60) % 4 == 0).astype(np.int64)
    np.savez(root / "xy.npz", X=x, y=y)
    raw_train = split_labeled("xy", x, y, 2).x_train  # the reader's split of the raw rows (its order)
    return root / "xy.npz", lambda out: _npz_input(out, raw_train)


def _tabular(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(11)
    for split, n in (("train", 30), ("test", 12)):
        with open(root / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["patient_id", "age", "chol", "smoker", "label", "source"])
            for i in range(n):
                w.writerow([f"p{split}{i}", int(rng.integers(30, 80)), int(rng.integers(150, 350)), int(i % 3 == 0),
                            i % 2, "AB"[i % 2]])  # fmt: skip
    return root, lambda out: root / "train.csv"  # the training file itself: label, source, id skipped


def _medmnist(root: Path) -> tuple[Path, Raw]:
    rng = np.random.default_rng(12)
    arrays = {}
    for split, n in (("train", 14), ("val", 4), ("test", 6)):
        arrays[f"{split}_images"] = _pixels(rng, n, (28, 28))
        arrays[f"{split}_labels"] = (np.arange(n) % 2).astype(np.uint8)[:, None]
    np.savez(root / "breastmnist.npz", **arrays)
    return root / "breastmnist.npz", lambda out: _npz_input(out, arrays["train_images"][:, None] / 255.0)


def _heart(root: Path) -> tuple[Path, Raw]:
    from fedxrisk.data.readers.heart import HOSPITALS, encode, feature_names, read_hospital, split_hospital
    from test_real_readers import _hospitals

    _hospitals(root, sizes=(30, 28, 14, 20))

    def raw(out: Path) -> Path:  # the encoded, unstandardized rows (age 63, chol 260), hospital by hospital
        rows = []
        for h in HOSPITALS:
            table, text = read_hospital(root / f"processed.{h}.data")
            rows.append(encode(table, text, "flamby")[split_hospital((table[:, -1] > 0).astype(np.int64))[0]])
        names = feature_names("flamby")
        with open(out / "heart_rows.csv", "w", newline="") as f:  # by name: columns in another order
            csv.writer(f).writerows(
                [["id", *names[::-1]], *([i, *r[::-1]] for i, r in enumerate(np.concatenate(rows)))]
            )
        return out / "heart_rows.csv"

    return root, raw


GENERATORS: dict[str, Callable[[Path], tuple[Path, Raw]]] = {
    "cifar10": lambda r: _cifar(r, fine=False), "cifar100": lambda r: _cifar(r, fine=True), "stl10": _stl10,
    "mnist": _idx, "fashionmnist": _idx, "folder": _folder, "sites": _sites, "manifest": _manifest,
    "chexpert": _chexpert, "chestxray_ih": _chestxray_ih, "npz": _npz_split, "npz_xy": _npz_xy,
    "tabular": _tabular, "medmnist": _medmnist, "heart_disease": _heart,
}  # fmt: skip
STANDARDIZING = ("npz_xy", "tabular", "heart_disease")  # readers whose model takes raw rows and standardizes
QUICK = ("npz_xy", "tabular", "heart_disease", "folder")  # the rest run in the slow set
# survival readers' predict = evaluate (risk scores of their own raw rows): tests/test_survival_cli.py
CLASSIFICATION = [r for r in READERS if r not in SURVIVAL_DATASETS]
CASES = [*CLASSIFICATION, "npz_xy"]  # npz has two layouts


def test_every_reader_has_a_generator():
    assert SURVIVAL_DATASETS and set(SURVIVAL_DATASETS) <= set(READERS)
    assert not set(CLASSIFICATION) - set(GENERATORS), "a registered reader has no tiny-data generator here"


def _train(case: str, root: Path) -> tuple[Path, Path, Raw]:
    reader = "npz" if case == "npz_xy" else case
    (root / "data").mkdir()
    data_dir, raw = GENERATORS[case](root / "data")
    sized = {"image_size": 8} if case in ("folder", "sites", "manifest", "chexpert", "chestxray_ih") else {}
    positive = {"positive_classes": ["b"]} if case in ("folder", "sites", "manifest") else {}
    cfg = RunConfig(algorithm="localsgdm", dataset=reader, data_dir=str(data_dir), clients=2, imratio=None,
                    partition="iid", model="mlp", rounds=1, stages=1, batch_size=4, workers=0, eval_every=1,
                    tensorboard=False, checkpoint_every=0, **sized, **positive)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_experiment(cfg, root / "run")
    return data_dir, root / "run", raw


def _derived_input(reader: str, data_dir: Path, image_size: int | None) -> Path:
    """An image reader's own training files, in its training order, as a manifest for predict."""
    data = load_dataset(reader, str(data_dir), lazy=True, image_size=image_size)
    x = data.x_train
    paths = [Path(x.source.paths[r]) for r in (x.rows if x.rows is not None else range(len(x.source.paths)))]
    base = Path(os.path.commonpath(paths))  # the manifest sits above every image, as predict requires
    manifest = base / "score_rows.csv"
    manifest.write_text("path\n" + "".join(f"{p.relative_to(base)}\n" for p in paths))
    return manifest


@pytest.mark.parametrize(
    "case", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
def test_predict_on_a_readers_own_raw_training_rows_equals_evaluate(case, tmp_path):
    reader = "npz" if case == "npz_xy" else case
    data_dir, run, raw = _train(case, tmp_path)
    trained = load_trained(run)
    record = trained.preprocessing
    evaluated = dataset_data(trained, reader, str(data_dir), "train", 0).scores  # evaluate's scoring path
    given = raw(tmp_path) or _derived_input(reader, data_dir, record.get("image_size"))
    predicted = predict(run, given).logits
    assert predicted.shape == evaluated.shape
    np.testing.assert_allclose(predicted, evaluated, rtol=1e-4, atol=1e-4)
    if given.name == "score_rows.csv":  # image files: the folder itself too, matched by path
        listed = given.read_text().splitlines()[1:]
        given.unlink()
        folder = predict(run, given.parent)
        by_path = dict(zip((i[0] for i in folder.ids), folder.logits))
        np.testing.assert_allclose([by_path[p] for p in listed], evaluated, rtol=1e-4, atol=1e-4)
    blob = torch.load(run / "model.pt", weights_only=True)["preprocessing"]
    assert blob["label_names"] == list(load_dataset(reader, str(data_dir), **(
        {"image_size": record["image_size"]} if "image_size" in record else {})).label_names)  # fmt: skip
    if len(trained.input_shape) == 3:  # images: shape in model.pt, channel order in the record
        assert record["channels"] == {1: "L", 3: "RGB"}[trained.input_shape[0]]
    if case in STANDARDIZING:  # raw-space mean/std and range, and the reader's own standardized rows refused
        assert "mean" in record and "range" in record
        model_rows = load_dataset(reader, str(data_dir)).x_train
        np.savez(tmp_path / "standardized.npz", x=model_rows)
        with pytest.raises(InputError, match=r"pre-standardized.*raw values|trained on inputs in"):
            predict(run, tmp_path / "standardized.npz")
    elif np.asarray(predicted).size and record.get("range", [0, 0])[1] <= 1.0:  # images in [0, 1]
        x = np.load(given)["x"] if str(given).endswith(".npz") else None
        if x is not None:
            np.savez(tmp_path / "pixels.npz", x=x * 255.0)
            with pytest.raises(InputError, match="trained on inputs in"):
                predict(run, tmp_path / "pixels.npz")


@pytest.fixture(scope="module")
def heart_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("heart")
    _, run, raw = _train("heart_disease", root)
    return run, raw(root)


def _predict_cli(run: Path, given: Path, out: Path):
    from click.testing import CliRunner

    from fedxrisk.cli import main

    return CliRunner().invoke(main, ["predict", str(run), str(given), "--out", str(out), "-q"])


def test_heart_rows_without_the_recorded_names_are_refused_naming_the_16_columns(heart_run, tmp_path):
    """The issue's cases: 16 encoded, unstandardized columns under other names were scored (5e-55, exit 0);
    10 raw UCI columns were refused without saying which 16 the model takes."""
    from fedxrisk.data.readers.heart import feature_names

    run, named = heart_run
    rows = list(csv.reader(named.open()))
    values = [r[1:][::-1] for r in rows[1:]]  # the 16 columns in the model's order, unnamed
    unnamed = tmp_path / "unnamed.csv"
    unnamed.write_text("\n".join(",".join(r) for r in [[f"x{j}" for j in range(16)], *values]) + "\n")
    ten = tmp_path / "ten.csv"
    ten.write_text(
        "\n".join(",".join(r[:10]) for r in [feature_names("flamby")[:8] + ["cp", "restecg"], *values])
    )
    for given in (unnamed, ten):
        result = _predict_cli(run, given, tmp_path / "p.csv")
        assert result.exit_code == 2, result.output
        assert (
            "missing feature column(s) ['" in result.output
            and "the model takes the columns ['age', 'sex'" in result.output
        )
        assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "p.csv").exists()
    assert _predict_cli(run, named, tmp_path / "p.csv").exit_code == 0  # the control: the same rows by name


def test_csv_rows_are_range_checked_like_npz_rows(heart_run, tmp_path):
    """One column a thousand times its training scale (chol in mg/L): the column means' median barely
    moves, so only the raw-space range catches it; CSV and npz inputs are checked alike."""
    run, named = heart_run
    rows = list(csv.reader(named.open()))
    chol = rows[0].index("chol")
    scaled = [rows[0], *([*r[:chol], str(float(r[chol]) * 1000), *r[chol + 1 :]] for r in rows[1:])]
    given = tmp_path / "scaled.csv"
    given.write_text("\n".join(",".join(r) for r in scaled) + "\n")
    with pytest.raises(InputError, match=r"values span \[.*\] but the model was trained on inputs in \[0, "):
        predict(run, given)


def test_pre_standardized_rows_are_told_from_raw_ones_by_the_column_means_and_a_few_rows_are_not_judged():
    from fedxrisk.data.preprocessing import STANDARDIZED_ROWS, off_training_scale

    rng = np.random.default_rng(0)
    raw = np.c_[
        rng.normal(60, 10, 200), rng.integers(0, 2, 200), rng.random(200) < 0.8
    ]  # age, two 0/1 columns
    mean, std = raw.mean(0), raw.std(0)
    record = {"kind": "features", "features": ["age", "smoker", "treated"], "mean": list(mean), "std": list(std),
              "range": [float(raw.min()), float(raw.max())]}  # fmt: skip
    z = (raw - mean) / std
    refused = off_training_scale(record, z.min(), z.max(), z.mean(0), len(z))
    assert refused is not None and "pre-standardized" in refused and "(furthest: age (" in refused
    assert off_training_scale(record, raw.min(), raw.max(), raw.mean(0), len(raw)) is None  # raw rows: scored
    near_zero = np.zeros(3)  # columns averaging 0, median 2 stds off: judged only over enough rows
    assert off_training_scale(record, -1.0, 1.0, near_zero, 1) is None  # one row: a raw patient may sit there
    assert off_training_scale(record, -1.0, 1.0, near_zero, STANDARDIZED_ROWS) is not None


def test_a_model_file_written_before_the_one_space_record_scores_raw_rows(tmp_path):
    """An ADBench ``X, y`` model.pt from before: range after standardization, mean/std before; raw rows
    failed the range and standardized rows the column means, so nothing could be scored."""
    import hashlib
    import json

    data_dir, run, raw = _train("npz_xy", tmp_path)
    blob = torch.load(run / "model.pt", weights_only=True)
    standardized = load_dataset("npz", str(data_dir)).x_train
    old = {k: blob["preprocessing"][k] for k in ("kind", "mean", "std")}
    blob["preprocessing"] = {**old, "range": [float(standardized.min()), float(standardized.max())]}
    torch.save(blob, run / "model.pt")
    summary = json.loads((run / "summary.json").read_text())
    summary["model_sha256"] = hashlib.sha256((run / "model.pt").read_bytes()).hexdigest()
    (run / "summary.json").write_text(json.dumps(summary))
    given = raw(tmp_path)
    expected = dataset_data(load_trained(run), "npz", str(data_dir), "train", 0).scores
    np.testing.assert_allclose(predict(run, given).logits, expected, rtol=1e-4, atol=1e-4)
