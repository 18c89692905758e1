"""Missing values in a hospital CSV (issue 41, item 3): the refusal names the column and counts the
rows; ``data.on_missing`` drops rows, drops columns, or imputes each site's own training mean."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.data.readers.arrays import read_tabular_csv
from fedxrisk.data.readers.base import DataFileError

HEADER = "age,chol,thal,bp,label,source"


def _write(folder, train, test):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.csv").write_text("\n".join([HEADER, *train]) + "\n")
    (folder / "test.csv").write_text("\n".join([HEADER, *test]) + "\n")
    return folder


def _table(tmp_path):
    """Two hospitals; 'thal' blank in 3 training rows and '?' in one test row; 'chol' missing at
    one Hungarian training row; Hungarian never recorded 'age' in training."""
    rng = np.random.default_rng(0)
    train, test = [], []
    for i in range(24):
        site = "cleveland" if i < 12 else "hungarian"
        chol = 200 + 10 * i if site == "cleveland" else 300 + 5 * i
        age = str(40 + i) if site == "cleveland" else ""
        thal = "" if i in (1, 5, 9) else str(int(rng.integers(3, 8)))
        chol_text = "NA" if i == 15 else str(chol)
        train.append(f"{age},{chol_text},{thal},{120 + i},{i % 2},{site}")
    for i in range(8):
        site = "cleveland" if i < 4 else "hungarian"
        thal = "?" if i == 6 else "6"
        chol = "" if i in (0, 5) else "250"
        test.append(f"{50 + i},{chol},{thal},{130 + i},{i % 2},{site}")
    return _write(tmp_path / "csv", train, test)


def _raw(data, column: str) -> tuple[np.ndarray, np.ndarray]:
    """The training and test values of ``column`` back in the file's units."""
    prep = data.preprocessing
    j = prep["features"].index(column)
    mean, std = prep["mean"][j], prep["std"][j]
    return data.x_train[:, j] * std + mean, data.x_test[:, j] * std + mean


def test_the_default_refusal_names_the_columns_and_counts_rows(tmp_path):
    folder = _table(tmp_path)
    with pytest.raises(
        DataFileError,
        match=r"missing values \(blank, '\?' or NA\) in column\(s\) 'age' \(12 of 32 rows\), 'thal' \(4 of 32 rows\), 'chol' \(3 of 32 rows\); set data.on_missing to drop_rows, drop_columns or impute",
    ):
        read_tabular_csv(folder)
    result = CliRunner().invoke(
        main, ["run", "--dataset", "tabular", "--data-dir", str(folder), "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2 and "'thal' (4 of 32 rows)" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_drop_rows_and_drop_columns(tmp_path):
    folder = _table(tmp_path)
    rows = read_tabular_csv(folder, "drop_rows")
    assert (len(rows.y_train), len(rows.y_test)) == (12 - 3, 8 - 3)  # Hungarian never has an age
    assert np.isfinite(rows.x_train).all() and set(rows.groups_train["source"].tolist()) == {0}
    columns = read_tabular_csv(folder, "drop_columns")
    assert columns.preprocessing["features"] == ["bp"] and columns.x_train.shape == (24, 1)


def test_impute_fills_each_sites_own_training_mean(tmp_path):
    folder = _table(tmp_path)
    data = read_tabular_csv(folder, "impute")
    cleveland_chol = np.mean([200 + 10 * i for i in range(12)])
    hungarian_chol = np.mean([300 + 5 * i for i in range(12, 24) if i != 15])
    train_chol, test_chol = _raw(data, "chol")
    assert train_chol[15] == pytest.approx(hungarian_chol, rel=1e-5)  # Hungarian's own mean, not the pooled
    assert test_chol[0] == pytest.approx(cleveland_chol, rel=1e-5) and test_chol[5] == pytest.approx(
        hungarian_chol, rel=1e-5
    )
    train_age, _ = _raw(data, "age")  # Hungarian recorded no age: the pooled training mean (Cleveland's)
    assert train_age[12:] == pytest.approx(np.full(12, np.mean([40 + i for i in range(12)])), rel=1e-5)
    assert np.isfinite(data.x_train).all() and np.isfinite(data.x_test).all()


def test_on_missing_is_refused_where_no_reader_takes_it(tmp_path):
    check = CliRunner().invoke(main, ["check", "--set", "data.on_missing=impute"])
    assert check.exit_code == 2 and "data.on_missing applies to tabular CSVs, not 'digits'" in check.output
    run = CliRunner().invoke(
        main, ["run", "--set", "data.on_missing=impute", "--rounds", "1", "--out", str(tmp_path / "r")]
    )
    assert run.exit_code == 2 and "data.on_missing applies to tabular CSVs, not 'digits'" in run.output
    bad = CliRunner().invoke(main, ["run", "--set", "data.on_missing=mean", "--out", str(tmp_path / "s")])
    assert bad.exit_code == 2 and "unknown data.on_missing 'mean'; choose one of" in bad.output, bad.output
