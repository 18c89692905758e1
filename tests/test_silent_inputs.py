"""Inputs that were read silently wrong (issue 41, item 5) now give one line: a survival row with more
fields than its header, ``split = val`` rows, a 2-D time array, an npz with ``x`` beside other feature
arrays, manifests naming images outside their folder or with short rows, ``compare -a ,``, ``plot`` of
runs on different data, and an evaluated label with one class only."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from fedxrisk.cli import main
from fedxrisk.data.readers.base import DataFileError
from fedxrisk.data.readers.manifest import read_manifest_table
from fedxrisk.data.readers.survival import read_survival_table
from fedxrisk.errors import ConfigError
from fedxrisk.evaluation import label_metrics, metric_warnings
from fedxrisk.experiment import RunConfig
from fedxrisk.inputs import InputError, open_input
from fedxrisk.plots import plot_runs
from test_plots import write_run

GOOD = ["time,event,age", *[f"{t},{t % 2},{30 + t}" for t in range(1, 13)]]


def _csv(tmp_path, lines):
    path = tmp_path / "s.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_survival_row_with_more_fields_than_the_header_is_refused(tmp_path):
    assert read_survival_table(_csv(tmp_path, GOOD)).x_train.shape[1] == 1  # the control reads
    with pytest.raises(DataFileError, match=r"line 3: 5 fields under a header of 3 columns"):
        read_survival_table(_csv(tmp_path, [GOOD[0], GOOD[1], "2,1,31,7,8", *GOOD[3:]]))


def test_a_split_other_than_train_or_test_is_refused(tmp_path):
    rows = [GOOD[0] + ",split", *[f"{r},{'test' if i % 4 == 0 else 'train'}" for i, r in enumerate(GOOD[1:])]]
    data = read_survival_table(_csv(tmp_path, rows))
    assert len(data.y_test) == 3 and len(data.y_train) == 9
    rows[2] = rows[2].replace(",train", ",val")
    with pytest.raises(DataFileError, match=r"split column holds \['val'\]; each row's split must be"):
        read_survival_table(_csv(tmp_path, rows))


def test_npz_time_must_be_one_value_per_patient_and_x_stands_alone(tmp_path):
    rng = np.random.default_rng(0)
    time, event = rng.uniform(1, 9, 28), np.arange(28) % 2
    path = tmp_path / "s.npz"
    np.savez(path, x=rng.normal(size=(28, 3)), time=time, event=event)
    assert read_survival_table(path).x_train.shape[1] == 3
    np.savez(path, x=rng.normal(size=(28, 3)), time=np.stack([time, time], 1), event=event)
    with pytest.raises(DataFileError, match=r"'time' has shape \(28, 2\); one value per patient"):
        read_survival_table(path)
    np.savez(path, x=rng.normal(size=(28, 3)), age=rng.normal(size=28), time=time, event=event)
    with pytest.raises(DataFileError, match=r"holds 'x' and other feature arrays \('age'\)"):
        read_survival_table(path)


def _images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / name)


def test_a_manifest_naming_images_outside_its_folder_is_refused(tmp_path):
    data = tmp_path / "study"
    _images(data, ["a.png", "b.png"])
    _images(tmp_path / "other", ["c.png"])
    manifest = data / "manifest.csv"
    manifest.write_text("path,label\na.png,1\nb.png,0\n")
    assert len(read_manifest_table(manifest, image_size=8).y) == 2  # the control reads
    manifest.write_text("path,label\na.png,1\n../other/c.png,0\n")
    with pytest.raises(DataFileError, match=r"1 image path\(s\) outside the folder"):
        read_manifest_table(manifest, image_size=8)
    with pytest.raises(InputError, match=r"1 image path\(s\) outside the folder"):
        open_input(manifest, (3, 8, 8))


def test_a_scored_manifest_with_a_short_row_is_refused(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,id\na.png,1\nb.png,2\n")
    assert open_input(manifest, (3, 8, 8)).kind == "manifest"
    manifest.write_text("path,id\na.png,1\nb.png\n")
    with pytest.raises(InputError, match=r"m.csv row 3: the fields do not match the header's 2"):
        open_input(manifest, (3, 8, 8))


def test_compare_with_an_empty_algorithm_list_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["compare", "-a", ",", "--out", str(tmp_path / "c")])
    assert result.exit_code == 2, result.output
    assert "--algorithms: expected a comma-separated list of at least one value" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "c").exists()


def test_plot_refuses_runs_tested_on_different_data(tmp_path):
    a = write_run(tmp_path / "a", RunConfig(rounds=2), [0.6, 0.7])
    b = write_run(tmp_path / "b", RunConfig(rounds=2, dataset="synthetic"), [0.6, 0.8])
    c = write_run(tmp_path / "c", RunConfig(rounds=2, seed=1), [0.6, 0.8])
    assert len(plot_runs([a, c], tmp_path / "same")) > 0  # the control: same data, plotted
    with pytest.raises(ConfigError, match=r"tested on different data .*plot each dataset's runs separately"):
        plot_runs([a, b], tmp_path / "mixed")
    assert not (tmp_path / "mixed").exists()


@pytest.mark.parametrize("missing", ["positive", "negative"])
def test_an_evaluated_label_with_one_class_is_named(missing):
    scores = np.linspace(0, 1, 12)
    y = np.zeros(12) if missing == "positive" else np.ones(12)
    metrics = label_metrics(y, scores, 20, [0])
    [warning] = metric_warnings({"score": metrics})
    assert f"12 row(s), no {missing} one: AUROC, AP and pAUC are undefined" in warning
    assert np.isnan(metrics["auroc"])
    both = label_metrics((scores > 0.5).astype(float), scores, 20, [0])
    assert metric_warnings({"score": both}) == []  # the control
