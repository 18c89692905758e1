"""`fedxrisk evaluate` / `predict`: a finished run's own metrics reproduced, scores equal to the model's
outputs computed directly, per-label and per-site tables, and bad input refused with nothing written."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import fedxrisk
from fedxrisk.cli import main
from fedxrisk.data.readers import read_image_folder, read_tabular_csv
from fedxrisk.experiment import RunConfig, build_data, load_model, run_experiment
from fedxrisk.metrics import auroc
from fedxrisk.stats import delong

TINY = dict(rounds=2, stages=1, eval_every=2, clients=2, tensorboard=False, checkpoint_every=0)


def _cli(args):
    return CliRunner(env={"COLUMNS": "80"}).invoke(main, [str(a) for a in args], catch_exceptions=False)


def _direct(run, x) -> np.ndarray:
    with torch.no_grad():
        return load_model(run)(torch.as_tensor(x)).reshape(len(x), -1).numpy()


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four finished tiny runs: digits (binary), multi-label .npz with sites, images, tabular."""
    root = tmp_path_factory.mktemp("eval")
    rng = np.random.default_rng(0)
    # multi-label .npz, 3 sources
    x = rng.normal(size=(150, 6)).astype(np.float32)
    y = (x[:, :2] + rng.normal(size=(150, 2)) > 0.3).astype(np.float32)
    np.savez(root / "ml.npz", x_train=x[:90], y_train=y[:90], x_test=x[90:], y_test=y[90:],
             source_train=np.repeat([0, 1, 2], 30))  # fmt: skip
    # class folders of 32×32 images: class 1 brighter
    for split, count in (("train", 10), ("test", 6)):
        for c in (0, 1):
            (root / "data" / "img" / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                level = int(rng.integers(40, 140)) + 70 * c
                pixels = np.clip(rng.normal(level, 30, size=(32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / "data" / "img" / split / f"c{c}" / f"{i}.png")
    # tabular: 4 features on different scales
    (root / "data" / "tab").mkdir(parents=True)
    feats = rng.normal(size=(80, 4)) * [1, 10, 100, 0.1] + [0, 5, -50, 1]
    label = (feats[:, 0] + feats[:, 1] / 10 + rng.normal(size=80) > 0.5).astype(int)
    for name, rows in (("train.csv", slice(0, 56)), ("test.csv", slice(56, 80))):
        with open(root / "data" / "tab" / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["f0", "f1", "f2", "f3", "label"])
            w.writerows([[*map(float, r), int(t)] for r, t in zip(feats[rows], label[rows])])
    configs = {
        "digits": RunConfig(**TINY),
        "ml": RunConfig(dataset="npz", data_dir=str(root / "ml.npz"), imratio=None, partition="iid", **TINY),
        "img": RunConfig(
            dataset="folder",
            data_dir=str(root / "data" / "img"),
            imratio=None,
            partition="iid",
            positive_classes=["c1"],
            **TINY,
        ),
        "tab": RunConfig(
            dataset="tabular", data_dir=str(root / "data" / "tab"), imratio=None, partition="iid", **TINY
        ),
    }
    for name, cfg in configs.items():  # data in root/data: a run's --out must be a new folder
        run_experiment(cfg, root / name)
    return root


@pytest.mark.filterwarnings(
    "ignore:data.batch_size = .* exceeds every client's data:UserWarning"
)  # tiny shards
@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_evaluate_reproduces_the_runs_final_metrics_and_client_counts(runs, tmp_path):
    result = fedxrisk.evaluate(runs / "digits", bootstrap=50, out=tmp_path)
    summary = json.loads((runs / "digits" / "summary.json").read_text())
    final = {k: v for k, v in summary["final"].items() if k not in ("round", "train_loss")}  # training-time
    assert result["summary"] == final  # exactly: same scores, same metric functions
    assert result["overall"]["score"]["auroc"] == final["test_auroc"]
    counts = [(m["score"]["positives"], m["score"]["negatives"]) for m in result["groups"].values()]
    assert counts == [tuple(c) for c in summary["data"]["client_counts"]]
    saved = json.loads((tmp_path / "evaluation.json").read_text())
    assert saved["overall"]["score"]["ap"] == final["test_ap"] and saved["group_kind"] == "client"
    assert all((tmp_path / f).stat().st_size > 0 for f in ("evaluation.md", "roc.png", "pr.png"))


def test_multilabel_run_reproduced_per_label(runs, tmp_path):
    result = fedxrisk.evaluate(runs / "ml", bootstrap=0, out=tmp_path)
    summary = json.loads((runs / "ml" / "summary.json").read_text())
    kept = {k: v for k, v in summary["final"].items() if k not in ("round", "train_loss") and v is not None}
    assert result["summary"] == kept
    assert list(result["overall"]) == ["label0", "label1"]
    assert result["overall"]["label1"]["auroc"] == summary["final"]["test_auroc_per_label"][1]
    assert np.isnan(result["overall"]["label0"]["ap_ci"][0])  # --bootstrap 0: no intervals


def test_bootstrap_intervals_reproducible_with_the_seed(runs, tmp_path):
    a = fedxrisk.evaluate(runs / "digits", bootstrap=200, seed=3, out=tmp_path / "a")
    b = fedxrisk.evaluate(runs / "digits", bootstrap=200, seed=3, out=tmp_path / "b")
    c = fedxrisk.evaluate(runs / "digits", bootstrap=200, seed=4, out=tmp_path / "c")
    assert a["overall"] == b["overall"] and a["groups"] == b["groups"]
    assert a["overall"]["score"]["ap_ci"] != c["overall"]["score"]["ap_ci"]
    m = a["overall"]["score"]
    assert m["ap_ci"][0] < m["ap"] < m["ap_ci"][1] and m["pauc30_ci"][0] < m["pauc30"] < m["pauc30_ci"][1]


def test_per_site_and_per_label_table_from_a_dataset_split_fits_80_columns(runs, tmp_path):
    result = _cli(["evaluate", runs / "ml", "--dataset", "npz", "--data-dir", runs / "ml.npz",
                   "--split", "train", "--bootstrap", "50", "--out", tmp_path])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    saved = json.loads((tmp_path / "evaluation.json").read_text())
    assert list(saved["groups"]) == ["site 0", "site 1", "site 2"] and saved["group_kind"] == "site"
    assert all(list(g) == ["label0", "label1"] for g in saved["groups"].values())
    assert [g["label0"]["n"] for g in saved["groups"].values()] == [30, 30, 30]
    assert "| site 2 / label1 |" in (tmp_path / "evaluation.md").read_text()
    arrays = np.load(runs / "ml.npz")  # read lazily (memory-mapped member) by evaluate; here directly
    direct = _direct(runs / "ml", arrays["x_train"])
    assert saved["overall"]["label1"]["auroc"] == pytest.approx(
        auroc(arrays["y_train"][:, 1], direct[:, 1]), abs=1e-12
    )


def test_manifest_evaluation_per_site_equals_direct_computation(runs, tmp_path):
    test = runs / "data" / "img" / "test"
    files = sorted(test.rglob("*.png"))
    with open(tmp_path / "m.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "source"])
        w.writerows(
            [[p.relative_to(test), int(p.parent.name == "c1"), f"h{i % 2}"] for i, p in enumerate(files)]
        )
    shutil.copytree(test, tmp_path, dirs_exist_ok=True)
    result = fedxrisk.evaluate(
        runs / "img", manifest=tmp_path / "m.csv", bootstrap=20, batch_size=5, out=tmp_path / "ev"
    )
    data = read_image_folder(runs / "data" / "img")
    y, s = data.y_test.astype(float), _direct(runs / "img", data.x_test)[:, 0]
    m = result["overall"]["score"]
    assert m["auroc"] == pytest.approx(auroc(y, s), abs=1e-12)
    assert m["auroc_se"] ** 2 == pytest.approx(delong(y, s).variance, rel=1e-9)
    assert (
        list(result["groups"]) == ["h0", "h1"] and result["groups"]["h1"]["score"]["n"] == 6
    )  # the column's names


def test_predict_npz_equals_model_outputs(runs, tmp_path):
    x = build_data(RunConfig(**TINY))[0].data.x_test.numpy()
    np.savez_compressed(tmp_path / "x.npz", x=x)  # read member-wise from the compressed stream
    one = fedxrisk.predict(
        runs / "digits", tmp_path / "x.npz", tmp_path / "one.csv", batch_size=len(x), scores="both"
    )
    assert np.array_equal(one.logits[:, 0], _direct(runs / "digits", x)[:, 0])
    rows = _read(tmp_path / "one.csv")
    assert list(rows[0]) == ["index", "prob", "logit"] and [int(r["index"]) for r in rows] == list(
        range(len(x))
    )
    assert np.array_equal(np.array([r["logit"] for r in rows], dtype=np.float32), one.logits[:, 0])
    assert np.allclose([float(r["prob"]) for r in rows], 1 / (1 + np.exp(-one.logits[:, 0])), atol=1e-8)
    batched = fedxrisk.predict(runs / "digits", tmp_path / "x.npz", batch_size=7)
    assert np.allclose(batched.logits, one.logits, atol=1e-6)


def test_predict_images_and_tabular_match_training_preprocessing(runs, tmp_path):
    test = runs / "data" / "img" / "test"
    pred = fedxrisk.predict(runs / "img", test, tmp_path / "img.csv", batch_size=5)
    data = read_image_folder(runs / "data" / "img")  # the reader that trained the model, decoding everything
    assert [i[0] for i in pred.ids] == [str(p.relative_to(test)) for p in sorted(test.rglob("*.png"))]
    assert np.allclose(pred.logits[:, 0], _direct(runs / "img", data.x_test)[:, 0], atol=1e-6)
    # tabular: the raw test rows, standardized with the run's training statistics
    tab = read_tabular_csv(runs / "data" / "tab")
    pred = fedxrisk.predict(
        runs / "tab", runs / "data" / "tab" / "test.csv", tmp_path / "tab.csv", scores="logit"
    )
    rows = _read(tmp_path / "tab.csv")
    assert list(rows[0]) == ["row", "logit"] and [int(r["row"]) for r in rows] == list(range(24))
    expected = _direct(runs / "tab", tab.x_test)[:, 0]
    assert np.allclose([float(r["logit"]) for r in rows], expected, atol=1e-6)
    assert np.allclose(pred.logits[:, 0], expected, atol=1e-6)


def test_predict_multilabel_columns(runs, tmp_path):
    pred = fedxrisk.predict(runs / "ml", runs / "ml.npz", tmp_path / "p.csv", scores="both")  # x_test
    assert list(_read(tmp_path / "p.csv")[0]) == [
        "index",
        "prob_label0",
        "prob_label1",
        "logit_label0",
        "logit_label1",
    ]
    x_test = np.load(runs / "ml.npz")["x_test"]
    assert np.allclose(pred.logits, _direct(runs / "ml", x_test), atol=1e-6)


def _refused(result, message, *absent):
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == f"Error: {message}"
    for path in absent:
        assert not path.exists()


def test_bad_input_exact_messages_exit_2_nothing_written(runs, tmp_path):
    out = tmp_path / "s.csv"
    broken = tmp_path / "broken_run"
    shutil.copytree(runs / "digits", broken)
    (broken / "model.pt").unlink()
    _refused(_cli(["evaluate", broken]),
             f"{broken}: no model.pt; not a finished fedxrisk run (evaluate a run that completed)",
             broken / "evaluation.json")  # fmt: skip
    _refused(_cli(["predict", broken, runs / "ml.npz", "--out", out]),
             f"{broken}: no model.pt; not a finished fedxrisk run (evaluate a run that completed)", out)  # fmt: skip
    _refused(_cli(["predict", runs / "digits", tmp_path / "nope.npz", "--out", out]),
             f"{tmp_path / 'nope.npz'}: input not found", out)  # fmt: skip
    (tmp_path / "notes.txt").write_text("hello")
    _refused(_cli(["predict", runs / "digits", tmp_path / "notes.txt", "--out", out]),
             f"{tmp_path / 'notes.txt'}: unknown input format '.txt'; expected an image folder, a .csv "
             "(a manifest with a 'path' column, or numeric features), or an .npz", out)  # fmt: skip
    (tmp_path / "narrow.csv").write_text("f0,f1,label\n1,2,0\n")
    _refused(_cli(["predict", runs / "tab", tmp_path / "narrow.csv", "--out", out]),
             f"{tmp_path / 'narrow.csv'}: missing feature column(s) ['f2', 'f3']; the model takes the columns "
             "['f0', 'f1', 'f2', 'f3'] (by name, any order; id, label and source are allowed)", out)  # fmt: skip
    if not torch.cuda.is_available():
        _refused(_cli(["evaluate", runs / "ml", "--device", "cuda", "--out", tmp_path / "ev"]),
                 "device 'cuda' requested but CUDA is not available", tmp_path / "ev")  # fmt: skip
    np.savez(tmp_path / "wide.npz", x=np.zeros((3, 7), np.float32))
    _refused(_cli(["predict", runs / "ml", tmp_path / "wide.npz", "--out", out]),
             f"{tmp_path / 'wide.npz'}: array 'x' holds samples of shape [7] (array [3, 7]); the model expects [6]", out)  # fmt: skip


def test_existing_output_refused_unless_overwrite(runs, tmp_path):
    out = tmp_path / "s.csv"
    out.write_text("keep me\n")
    _refused(_cli(["predict", runs / "ml", runs / "ml.npz", "--out", out]),
             f"{out}: already exists; choose another --out or pass --overwrite to replace it")  # fmt: skip
    assert out.read_text() == "keep me\n"
    assert _cli(["predict", runs / "ml", runs / "ml.npz", "--out", out, "--overwrite", "-q"]).exit_code == 0
    assert len(_read(out)) == 60
    first = _cli(["evaluate", runs / "ml", "--bootstrap", "0", "--out", tmp_path / "ev", "-q"])
    assert first.exit_code == 0
    before = (tmp_path / "ev" / "evaluation.json").read_text()
    _refused(_cli(["evaluate", runs / "ml", "--out", tmp_path / "ev"]),
             f"{tmp_path / 'ev'}: already holds evaluation.json, evaluation.md, roc.png, pr.png; "
             "pass --overwrite to replace, or --out")  # fmt: skip
    assert (tmp_path / "ev" / "evaluation.json").read_text() == before


def test_missing_and_corrupt_images_named_nothing_written(runs, tmp_path):
    (tmp_path / "m.csv").write_text("path,label\na.png,0\nb.png,1\n")
    out = tmp_path / "s.csv"
    _refused(_cli(["predict", runs / "img", tmp_path / "m.csv", "--out", out]),
             f"{tmp_path / 'm.csv'}: 2 image(s) not found: {tmp_path / 'a.png'}, {tmp_path / 'b.png'}", out)  # fmt: skip
    folder = tmp_path / "imgs"
    shutil.copytree(runs / "data" / "img" / "test" / "c0", folder)
    (folder / "z.png").write_bytes(b"not a png")
    result = _cli(["predict", runs / "img", folder, "--out", out, "--batch-size", "2"])
    assert result.exit_code == 2 and f"Error: {folder / 'z.png'}: cannot decode image" in result.output
    assert not out.exists() and not (tmp_path / "s.csv.tmp").exists()
