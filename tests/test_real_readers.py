"""Readers for MedMNIST archives, the UCI heart-disease hospitals and ADBench-style ``X, y`` archives,
on small generated files of each layout (never the real files); every bad file gives one named error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedxrisk.data import binarize, load_dataset, make_federated
from fedxrisk.data.readers import DataFileError, MissingDataError, read_heart_disease, read_medmnist, read_npz
from fedxrisk.data.readers.heart import COLUMNS, HOSPITALS, encode

RNG = np.random.default_rng(0)


# ------------------------------------------------------------- MedMNIST ----
def _medmnist(path: Path, rgb: bool = False, labels: int = 1, classes: int = 3, sizes=(12, 6, 8), **override):
    arrays = {}
    for split, n in zip(("train", "val", "test"), sizes):
        shape = (n, 28, 28, 3) if rgb else (n, 28, 28)
        arrays[f"{split}_images"] = RNG.integers(0, 256, size=shape, dtype=np.uint8)
        if labels == 1:
            y = np.arange(n) % classes  # every class in every split
            arrays[f"{split}_labels"] = y.astype(np.uint8)[:, None]
        else:
            arrays[f"{split}_labels"] = RNG.integers(0, 2, size=(n, labels)).astype(np.uint8)
    arrays.update(override)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return arrays


def test_medmnist_grey_multiclass_reads_exactly_with_its_validation_split(tmp_path):
    a = _medmnist(tmp_path / "breastmnist.npz")
    data = read_medmnist(tmp_path / "breastmnist.npz")
    assert data.name == "breastmnist" and data.num_classes == 3 and not data.multilabel
    for split in ("train", "val", "test"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        np.testing.assert_array_equal(x, a[f"{split}_images"][:, None].astype(np.float32) / 255)
        np.testing.assert_array_equal(y, a[f"{split}_labels"][:, 0].astype(np.int64))
        assert x.dtype == np.float32 and y.dtype == np.int64
    assert len(data.x_train) == 12 and len(data.x_val) == 6 and len(data.x_test) == 8  # never merged
    folder = read_medmnist(tmp_path)  # a folder holding the one archive
    np.testing.assert_array_equal(folder.x_val, data.x_val)
    binary = binarize(data, [0])
    np.testing.assert_array_equal(binary.y_val.numpy(), (a["val_labels"][:, 0] == 0).astype(np.float32))
    assert binary.x_val.shape == (6, 1, 28, 28)


def test_medmnist_rgb_multilabel_keeps_the_findings(tmp_path):
    a = _medmnist(tmp_path / "chestmnist.npz", rgb=True, labels=14)
    data = load_dataset("medmnist", str(tmp_path / "chestmnist.npz"))
    assert data.multilabel and data.num_classes == 14 and data.x_train.shape == (12, 3, 28, 28)
    np.testing.assert_array_equal(data.x_test[3, 2, 5, 7], a["test_images"][3, 5, 7, 2] / np.float32(255))
    np.testing.assert_array_equal(data.y_val, a["val_labels"].astype(np.float32))
    binary = binarize(data)
    assert binary.num_labels == 14 and binary.y_val.shape == (6, 14)


def test_medmnist_lazy_inputs_decode_as_loaded(tmp_path):
    _medmnist(tmp_path / "m.npz", rgb=True)
    eager = load_dataset("medmnist", str(tmp_path / "m.npz"))
    lazy = load_dataset("medmnist", str(tmp_path / "m.npz"), lazy=True)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(lazy, f"x_{split}").numpy(), getattr(eager, f"x_{split}"))


def test_medmnist_validation_split_reaches_the_federated_data(tmp_path):
    _medmnist(tmp_path / "m.npz", classes=2, sizes=(40, 10, 12))
    fed = make_federated("medmnist", 2, "iid", None, data_dir=str(tmp_path / "m.npz"), positive_classes=[0])
    assert fed.data.x_val.shape == (10, 1, 28, 28) and fed.data.y_val.tolist() == [1.0, 0.0] * 5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"val_labels": None}, r"missing array\(s\) \['val_labels'\]"),
        ({"train_labels": np.zeros((12, 1, 1), np.uint8)}, r"train_labels: labels must be \[N, 1\] class ids or \[N, L\]"),
        ({"test_labels": np.zeros((7, 1), np.uint8)}, r"test_labels: .* for the 8 images, got shape \(7, 1\)"),
        ({"val_images": np.zeros((6, 28, 28), np.float32)}, r"val_images: images must be uint8"),
        ({"train_images": np.zeros((12, 28, 28, 2), np.uint8)}, r"images must be \[N, H, W\] \(grey\) or \[N, H, W, 3\]"),
        ({"test_images": np.zeros((8, 14, 14), np.uint8)}, r"images differ in shape between splits"),
        ({"val_labels": np.zeros((6, 2), np.uint8)}, r"label columns differ between splits"),
        ({"train_labels": np.full((12, 1), -1)}, r"train_labels: labels must be class ids ≥ 0"),
        ({"test_images": np.zeros((0, 28, 28), np.uint8), "test_labels": np.zeros((0, 1), np.uint8)},
         r"test_images holds no images"),
    ],
)  # fmt: skip
def test_medmnist_bad_archives_are_named(tmp_path, override, message):
    _medmnist(tmp_path / "m.npz", **override)
    with pytest.raises(DataFileError, match=message):
        read_medmnist(tmp_path / "m.npz")


def test_medmnist_bad_multilabel_values_and_files(tmp_path):
    _medmnist(tmp_path / "m.npz", labels=3, train_labels=np.full((12, 3), 2, np.uint8))
    with pytest.raises(
        DataFileError, match=r"train_labels has 3 columns \(multi-label\) but values other than 0/1"
    ):
        read_medmnist(tmp_path / "m.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(
        MissingDataError, match=r"holds 2 .npz files \(bad.npz, m.npz\); set data_dir to the file"
    ):
        read_medmnist(tmp_path)
    with pytest.raises(DataFileError, match="not a readable .npz archive"):
        read_medmnist(tmp_path / "bad.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingDataError, match="holds 0 .npz files"):
        read_medmnist(tmp_path / "empty")


# --------------------------------------------------------- heart disease ----
def _row(rng: np.random.Generator, restecg_missing: bool = False) -> list[str]:
    """One UCI line: age, sex, cp, trestbps, chol, fbs, restecg, thalach, exang, oldpeak, slope, ca, thal, num."""
    values = [rng.integers(30, 80), rng.integers(0, 2), rng.integers(1, 5), rng.integers(90, 180),
              rng.integers(150, 350), rng.integers(0, 2), rng.integers(0, 3), rng.integers(90, 200),
              rng.integers(0, 2), round(float(rng.uniform(0, 4)), 1), "?", "?", "?", rng.integers(0, 5)]  # fmt: skip
    cells = [str(v) for v in values]
    if restecg_missing:
        cells[6] = "?"
    return cells


def _hospitals(root: Path, sizes=(30, 28, 14, 20), skip=()) -> dict[str, list[list[str]]]:
    rng = np.random.default_rng(1)
    root.mkdir(exist_ok=True)
    tables = {}
    for name, n in zip(HOSPITALS, sizes):
        rows = [_row(rng) for _ in range(n)]
        rows[0][4] = "?"  # a missing kept value: the row is dropped
        if name in ("hungarian", "switzerland"):
            rows[1] = _row(rng, restecg_missing=True)  # restecg read as text there (FLamby)
        if name == "switzerland":
            for r in rows:
                r[-1] = str(1 + int(r[-1]) % 4)  # every patient ill: a one-class test split
        tables[name] = rows
        if name not in skip:
            (root / f"processed.{name}.data").write_text("".join(",".join(r) + "\n" for r in rows))
    return tables


def test_heart_disease_drops_missing_rows_and_splits_each_hospital_like_flamby(tmp_path):
    tables = _hospitals(tmp_path)
    data = read_heart_disease(tmp_path)
    sources = np.concatenate([data.groups_train["source"], data.groups_test["source"]])
    kept = {h: [r for r in rows if "?" not in r[:10] + r[13:]] for h, rows in tables.items()}
    assert np.bincount(sources).tolist() == [len(kept[h]) for h in HOSPITALS] == [29, 26, 12, 19]
    test_sizes = np.bincount(data.groups_test["source"]).tolist()
    assert test_sizes == [int(np.ceil(0.34 * len(kept[h]) - 1e-9)) for h in HOSPITALS]
    assert data.x_train.shape[1] == 16 and data.num_classes == 2
    np.testing.assert_allclose(data.x_train.mean(0), 0, atol=1e-5)  # standardized on training rows
    swiss = data.y_test[data.groups_test["source"] == 2]
    assert swiss.min() == swiss.max() == 1  # one class in Switzerland's test split; pooled test has both
    assert set(data.y_test.tolist()) == {0, 1}
    onehot = read_heart_disease(tmp_path, encoding="onehot")
    assert onehot.x_train.shape[1] == 13 and len(onehot.y_train) == len(data.y_train)


def test_heart_disease_encoding_equals_the_codebook():
    table = np.array([[63, 1, 4, 145, 233, 1, 2, 150, 0, 2.3, 2], [41, 0, 2, 130, 204, 0, 0, 172, 0, 1.4, 0]])
    numeric = [[63, 1, 145, 233, 1, 150, 0, 2.3], [41, 0, 130, 204, 0, 172, 0, 1.4]]
    cp = [[0, 0, 1], [1, 0, 0]]
    np.testing.assert_array_equal(encode(table, False, "onehot"), np.hstack([numeric, cp, [[0, 1], [0, 0]]]))
    np.testing.assert_array_equal(
        encode(table, False, "flamby"), np.hstack([numeric, cp, [[0, 1], [0, 0]], np.zeros((2, 3))])
    )
    np.testing.assert_array_equal(
        encode(table, True, "flamby"), np.hstack([numeric, cp, np.zeros((2, 2)), [[0, 0, 1], [1, 0, 0]]])
    )


def test_heart_disease_hospitals_are_sources_for_the_source_partition(tmp_path):
    _hospitals(tmp_path)
    data = read_heart_disease(tmp_path)
    fed = make_federated("heart_disease", 4, "source", None, data_dir=str(tmp_path), one_class_ok=True)
    for k, shard in enumerate(fed.shards):
        assert set(fed.data.groups_train["source"][shard].tolist()) == {k}
    assert sorted(len(s) for s in fed.shards) == sorted(np.bincount(data.groups_train["source"]).tolist())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows.append(["1"] * 13), r"processed.va.data line \d+: 13 fields, expected 14"),
        (lambda rows: rows[3].__setitem__(0, "abc"), r"processed.va.data line 4: 'abc' is not a number or '\?'"),
        (lambda rows: rows[3].__setitem__(2, "7"), r"processed.va.data line 4: cp = 7, expected one of \[1, 2, 3, 4\]"),
        (lambda rows: rows[3].__setitem__(3, "nan"), r"processed.va.data line 4: non-finite value"),
        (lambda rows: rows[3].__setitem__(13, "-1"), r"processed.va.data: num \(the last column\) must be an integer"),
        (lambda rows: rows.clear(), r"processed.va.data: no rows"),
    ],
)  # fmt: skip
def test_heart_disease_bad_files_are_named(tmp_path, edit, message):
    tables = _hospitals(tmp_path)
    rows = tables["va"]
    edit(rows)
    (tmp_path / "processed.va.data").write_text("".join(",".join(r) + "\n" for r in rows))
    with pytest.raises(DataFileError, match=message):
        read_heart_disease(tmp_path)


def test_heart_disease_missing_hospital_file_is_named(tmp_path):
    _hospitals(tmp_path, skip=("switzerland",))
    with pytest.raises(MissingDataError, match=r"heart_disease: processed.switzerland.data not found in"):
        read_heart_disease(tmp_path)
    assert len(COLUMNS) == 14


# ------------------------------------------------------------ ADBench npz ----
def _xy(path: Path, n: int = 200, **override) -> dict[str, np.ndarray]:
    x = RNG.normal(5.0, 3.0, size=(n, 4))
    y = (np.arange(n) % 10 == 0).astype(np.int64)  # 10 % positives
    arrays = {"X": x, "y": y, **override}
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return arrays


def test_adbench_xy_split_stratified_and_standardized_on_training_rows(tmp_path):
    a = _xy(tmp_path / "5_campaign.npz")
    data = read_npz(tmp_path / "5_campaign.npz")
    assert data.name == "5_campaign" and len(data.y_train) == 140 and len(data.y_test) == 60
    assert data.y_train.sum() == 14 and data.y_test.sum() == 6  # stratified
    np.testing.assert_allclose(data.x_train.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(data.x_train.std(0), 1, atol=1e-4)
    raw, z = a["X"].astype(np.float32), np.concatenate([data.x_train, data.x_test])
    rows = np.empty(200, dtype=np.int64)  # standardizing keeps each column's order: recover the rows
    rows[np.argsort(z[:, 0])] = np.argsort(raw[:, 0])
    np.testing.assert_array_equal(a["y"][rows], np.concatenate([data.y_train, data.y_test]))
    mean, std = raw[rows[:140]].mean(0), raw[rows[:140]].std(0)  # training rows' statistics, for both
    np.testing.assert_allclose(z, (raw[rows] - mean) / std, atol=1e-5)
    lazy = load_dataset("npz", str(tmp_path / "5_campaign.npz"), lazy=True)
    np.testing.assert_array_equal(lazy.x_train.numpy(), data.x_train)
    np.testing.assert_array_equal(lazy.x_test.numpy(), data.x_test)
    np.testing.assert_array_equal(lazy.y_test, data.y_test)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"y": None}, r"missing array\(s\) \['y'\]"),
        ({"y": np.zeros((200, 2), np.int64)}, r"y must hold one class id per row of X \(200, 4\), got shape \(200, 2\)"),
        ({"y": np.zeros(199, np.int64)}, r"got shape \(199,\)"),
        ({"y": np.full(200, 0.5)}, r"y: labels must be integer class ids, found 0.5"),
        ({"X": np.where(np.arange(800).reshape(200, 4) == 9, np.nan, 1.0)}, r"X: 1 non-finite value\(s\) \(NaN/inf\) in row 2"),
        ({"y": np.r_[np.zeros(199, np.int64), 1]}, r"every class needs at least 2 rows"),
    ],
)  # fmt: skip
def test_adbench_bad_archives_are_named(tmp_path, override, message):
    _xy(tmp_path / "d.npz", **override)
    with pytest.raises(DataFileError, match=message):
        read_npz(tmp_path / "d.npz")


# ------------------------------------------------------------- streaming ----
@pytest.mark.parametrize("reader", ["medmnist", "npz"])
def test_streamed_run_equals_in_memory_run(tmp_path, reader):
    from fedxrisk.data.lazy import LazySamples
    from fedxrisk.experiment import RunConfig, build
    from helpers import max_abs_diff, run_all

    path = tmp_path / "d.npz"
    _medmnist(path, classes=2, sizes=(40, 10, 12)) if reader == "medmnist" else _xy(path, n=200)

    def trained(stream: bool):
        cfg = RunConfig(algorithm="codasca", dataset=reader, data_dir=str(path), clients=2, imratio=None,
                        partition="iid", model="mlp", rounds=2, stages=1, local_steps=2, batch_size=6,
                        stream=stream, workers=0, eval_every=1, tensorboard=False)  # fmt: skip
        setup = build(cfg)
        return setup, run_all(setup.simulation)

    (mem_setup, mem), (st_setup, st) = trained(False), trained(True)
    assert isinstance(st_setup.data.data.x_train, LazySamples) and st_setup.data.stream.misses == 0
    assert not isinstance(mem_setup.data.data.x_train, LazySamples)
    if reader == "medmnist":  # the validation split travels with the data, lazily when streamed
        assert isinstance(st_setup.data.data.x_val, LazySamples)
        np.testing.assert_array_equal(st_setup.data.data.x_val.numpy(), mem_setup.data.data.x_val.numpy())
    assert max_abs_diff(mem.states, st.states) < 1e-5


def test_heart_disease_line_numbers_count_blank_lines(tmp_path):
    tables = _hospitals(tmp_path)
    rows = tables["cleveland"]
    rows[2][2] = "9"
    (tmp_path / "processed.cleveland.data").write_text("\n" + "".join(",".join(r) + "\n" for r in rows))
    with pytest.raises(DataFileError, match=r"processed.cleveland.data line 4: cp = 9, expected one of"):
        read_heart_disease(tmp_path)
