"""Sites by name (issue 41, item 2): the readers' site names reach summary.json, ``evaluate`` and
``cross-site``; ``data.sources`` trains on a subset of the sites (a local-only baseline from the CLI)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.data import make_federated
from fedxrisk.data.readers.arrays import read_tabular_csv
from fedxrisk.data.readers.heart import HOSPITALS, read_heart_disease
from fedxrisk.data.types import site_name
from test_real_readers import _hospitals


def _run(tmp_path, data, *extra):
    out = tmp_path / "run"
    args = ["run", "--dataset", "heart_disease", "--data-dir", str(data), "-a", "localsgdm", "--rounds", "1",
            "--imratio", "none", "--set", "data.partition=source", "--out", str(out), *extra]  # fmt: skip
    return CliRunner().invoke(main, args), out


@pytest.fixture(scope="module")
def heart(tmp_path_factory):
    root = tmp_path_factory.mktemp("heart")
    _hospitals(root, sizes=(40, 36, 24, 30))
    return root


def test_the_heart_reader_names_its_hospitals(heart):
    data = read_heart_disease(heart)
    assert data.source_names == HOSPITALS
    assert site_name(data.source_names, 2) == "switzerland" and site_name((), 2) == "site 2"


def test_a_heart_run_names_its_sites_in_the_summary_evaluate_and_cross_site(heart, tmp_path):
    result, out = _run(tmp_path, heart, "--clients", "4")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["client_sites"] == list(HOSPITALS)
    evaluated = CliRunner().invoke(main, ["evaluate", str(out), "--bootstrap", "20"])
    assert evaluated.exit_code == 0, evaluated.output
    groups = json.loads((out / "evaluation.json").read_text())["groups"]
    assert list(groups) == list(HOSPITALS)
    assert all(name in evaluated.output for name in ("cleveland", "hungarian", "va"))
    crossed = CliRunner().invoke(main, ["cross-site", str(out), "--out", str(tmp_path / "x")])
    assert crossed.exit_code == 0, crossed.output
    matrix = json.loads((tmp_path / "x" / "cross_site.json").read_text())["matrix"]
    assert [k for k in next(iter(matrix.values())) if k != "pooled"] == list(HOSPITALS)
    assert "| model | cleveland | hungarian | switzerland | va | pooled |" in crossed.output


def test_data_sources_trains_on_cleveland_alone_and_keeps_the_whole_test_set(heart, tmp_path):
    every = make_federated("heart_disease", 4, "source", None, data_dir=str(heart), one_class_ok=True)
    alone = make_federated(
        "heart_disease", 1, "source", None, data_dir=str(heart), one_class_ok=True, sources=["cleveland"]
    )
    cleveland = every.data.groups_train["source"] == 0
    assert alone.client_sites() == ["cleveland"] and every.client_sites() == list(HOSPITALS)
    assert np.array_equal(alone.data.x_train.numpy(), every.data.x_train.numpy()[cleveland])
    assert np.array_equal(alone.data.x_test.numpy(), every.data.x_test.numpy())  # scored on every patient
    result, out = _run(tmp_path, heart, "--clients", "1", "--set", 'data.sources=["cleveland"]')
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["client_sites"] == ["cleveland"]
    assert summary["data"]["train_samples"] == int(cleveland.sum())


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (
            '["boston"]',
            r"data.sources: \['boston'\] not among heart_disease's sites \['cleveland', 'hungarian'",
        ),
        ('["va", "va"]', r"data.sources names a site twice"),
    ],
)
def test_an_unknown_or_repeated_site_is_one_line(heart, tmp_path, sources, message):
    result, out = _run(tmp_path, heart, "--clients", "1", "--set", f"data.sources={sources}")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    import re

    assert re.search(message, result.output), result.output
    assert not (out / "summary.json").exists()


def test_a_csv_source_column_names_the_sites(tmp_path):
    rng = np.random.default_rng(0)
    lines = ["f1,f2,label,source"]
    for i in range(60):
        lines.append(f"{rng.normal():.3f},{rng.normal():.3f},{i % 2},{('north', 'south', 'east')[i % 3]}")
    (tmp_path / "data.csv").write_text("\n".join(lines) + "\n")
    data = read_tabular_csv(tmp_path)
    assert data.source_names == ("east", "north", "south")
    fed = make_federated(
        "tabular", 2, "source", None, data_dir=str(tmp_path), one_class_ok=True, sources=["north", "south"]
    )
    assert fed.client_sites() == ["north", "south"]
