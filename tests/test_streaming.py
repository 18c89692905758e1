"""Streaming file datasets: a streamed run equals the in-memory run; bad files are named or skipped."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedxrisk.data.augment import RandomCropFlip
from fedxrisk.data.lazy import LazySamples, npz_member
from fedxrisk.data.stream import BadFileError, choose, parse_bytes
from fedxrisk.experiment import ConfigError, RunConfig, build, resume_experiment, run_experiment
from fedxrisk.run.build import build_data
from fedxrisk.run.checks import checked
from helpers import max_abs_diff, run_all, write_image_folder

FINAL = ("test_auroc", "test_ap", "client_auroc_mean")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root, per_class=24, size=8)
    return root


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    """A multi-label CheXpert-style manifest: 3 findings (1, 0, blank, -1 uncertain), 8×8 PNGs."""
    root = tmp_path_factory.mktemp("manifest")
    rng = np.random.default_rng(1)
    rows = []
    for i in range(48):
        labels = rng.integers(0, 2, 3)
        pixels = rng.integers(0, 150, (8, 8, 3)) + 100 * labels[:, None, None].T
        Image.fromarray(pixels.astype(np.uint8)).save(root / f"img{i:02d}.png")
        cells = ["1" if v else ("" if i % 3 else "0") for v in labels]
        if i % 7 == 0:
            cells[2] = "-1"  # uncertain: ones
        rows.append([f"img{i:02d}.png", *cells, "train" if i < 36 else "test"])
    with open(root / "manifest.csv", "w", newline="") as f:
        csv.writer(f).writerows([["path", "f0", "f1", "f2", "split"], *rows])
    return root


def _cfg(data_dir, stream=True, engine="loop", dataset="folder", **kw) -> RunConfig:
    base = dict(algorithm="codasca", dataset=dataset, data_dir=str(data_dir), clients=3, imratio=None,
                partition="iid", model="mlp", rounds=3, stages=1, local_steps=2, batch_size=6,
                engine=engine, stream=stream, workers=1, eval_every=1, tensorboard=False)  # fmt: skip
    if dataset == "folder":
        base["positive_classes"] = ["b"]
    return RunConfig(**{**base, **kw})


def _trained(cfg: RunConfig, augment: bool = False):
    setup = build(cfg)
    if augment:  # same augmenter seed on both paths: the same RNG draws in the same order
        setup.data.augment = RandomCropFlip(padding=2, seed=3)
    return setup, run_all(setup.simulation)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_streamed_image_folder_run_equals_in_memory_run(folder, engine):
    mem_setup, mem = _trained(_cfg(folder, False, engine), augment=True)
    st_setup, st = _trained(_cfg(folder, True, engine), augment=True)
    assert isinstance(st_setup.data.data.x_train, LazySamples)  # really streamed
    assert not isinstance(mem_setup.data.data.x_train, LazySamples)
    assert st_setup.data.stream.misses == 0  # every batch came from the prefetching loader
    # the augmenter was set after build: from the first batch on, the worker crops and flips
    assert st_setup.data.stream.augmented_by_workers >= st.plans[0].window * len(st.plans) - 5
    assert max_abs_diff(mem.states, st.states) < 1e-5


@pytest.mark.parametrize("engine", ["loop", pytest.param("vmap", marks=pytest.mark.slow)])
def test_streamed_multilabel_manifest_run_equals_in_memory_run(manifest, tmp_path, engine):
    runs = {}
    for stream in (False, True):
        cfg = _cfg(manifest, stream, engine, dataset="manifest", model="linear", clients=2, batch_size=4)
        runs[stream] = run_experiment(cfg, tmp_path / f"run-{stream}").summary
    mem, st = runs[False], runs[True]
    assert st["data"]["stream"]["streamed"] and not mem["data"]["stream"]["streamed"]
    assert len(st["final"]["test_auroc_per_label"]) == 3
    for key in FINAL:
        assert abs(st["final"][key] - mem["final"][key]) < 1e-5, key
    assert np.allclose(st["final"]["test_auroc_per_label"], mem["final"]["test_auroc_per_label"], atol=1e-5)


def test_auto_streams_above_the_memory_budget_and_says_why(folder):
    # 48 images: 33 train (70%) × 3×32×32 float32 = 405,504 bytes decoded
    small = build_data(checked(_cfg(folder, "auto", memory_budget="100KB")).config)[1]  # build refuses it
    # the stream choice alone: build also weighs the budget against this process's RSS, which in a
    # long pytest process may exceed 1 GB (tests/test_memory_budget.py checks that in a subprocess)
    large = build_data(checked(_cfg(folder, "auto", memory_budget="1GB")).config)[1]
    assert small.streamed and small.reason == (
        "data.stream = auto: the decoded training set takes 0.4 MB, more than the memory budget 0.1 MB"
    )
    assert not large.streamed and large.reason == (
        "data.stream = auto: the decoded training set takes 0.4 MB, within the memory budget 1.00 GB"
    )
    assert parse_bytes("500 MB") == 500_000_000 and parse_bytes(1234) == 1234
    assert choose(True, 10, 1, 2).workers == 2 and choose(False, 10, 1, 2).workers == 0


def test_npz_inputs_are_memory_mapped_and_decode_as_loaded(tmp_path):
    x = np.random.default_rng(0).random((6, 2, 3)).astype(np.float32)
    np.savez(tmp_path / "plain.npz", x=x)
    np.savez_compressed(tmp_path / "packed.npz", x=x)
    mapped = npz_member(tmp_path / "plain.npz", "x")
    assert isinstance(mapped, np.memmap) and np.array_equal(mapped, x)
    assert not isinstance(npz_member(tmp_path / "packed.npz", "x"), np.memmap)  # compressed: read


def test_missing_manifest_files_are_all_named_before_anything_is_written(manifest, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    rows = (manifest / "manifest.csv").read_text().splitlines()
    for r in rows[1:]:
        name = r.split(",")[0]
        if name not in ("img03.png", "img40.png"):
            (broken / name).write_bytes((manifest / name).read_bytes())
    (broken / "manifest.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        run_experiment(_cfg(broken, True, dataset="manifest", model="linear"), out)
    assert str(e.value) == (
        f"2 of 48 image file(s) not found: {broken / 'img03.png'}, {broken / 'img40.png'}"
    )
    assert not out.exists()


def _corrupt(path: Path) -> bytes:
    good = path.read_bytes()
    path.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    return good


@pytest.mark.slow  # a run stopped and resumed (the skip case stays quick)
def test_corrupt_image_stops_the_run_naming_it_and_the_run_resumes(folder, tmp_path):
    data = tmp_path / "images"
    write_image_folder(data, per_class=24, size=8)
    victim = data / "b" / "005.png"
    cfg = _cfg(data, True, rounds=4, checkpoint_every=1, workers=0)
    reference = run_experiment(cfg, tmp_path / "reference").summary

    def corrupt_after_round_2(row, done, total):
        if done == 2:
            good.append(_corrupt(victim))

    good: list[bytes] = []
    out = tmp_path / "run"
    with pytest.raises(BadFileError) as e:
        run_experiment(cfg, out, corrupt_after_round_2)
    assert str(e.value).startswith(f"corrupt or unreadable data file {victim} (")
    assert str(e.value).endswith(
        "training stopped. Replace the file and continue with `fedxrisk run --resume RUN_DIR` "
        '(the last checkpoint is kept), or run with data.on_bad_file = "skip" to replace unreadable samples'
    )
    assert not (out / "summary.json").exists()
    assert torch.load(out / "checkpoint.pt", weights_only=True)["simulation"]["round"] == 2
    assert len((out / "history.csv").read_text().splitlines()) == 1 + 2  # rows of rounds 1-2 kept
    victim.write_bytes(good[0])
    resumed = resume_experiment(out).summary
    for key in FINAL:
        assert resumed["final"][key] == reference["final"][key]


def test_skip_replaces_a_corrupt_image_reproducibly_and_counts_it(tmp_path):
    data = tmp_path / "images"
    write_image_folder(data, per_class=24, size=8)
    victim = data / "a" / "002.png"
    _corrupt(victim)
    cfg = _cfg(data, True, on_bad_file="skip", workers=0)
    first = run_experiment(cfg, tmp_path / "one").summary
    second = run_experiment(cfg, tmp_path / "two").summary
    stream = first["data"]["stream"]
    assert stream["bad_files"] == [str(victim)] and stream["bad_samples_skipped"] > 0
    assert first["final"] == second["final"] and second["data"]["stream"] == stream
    saved = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert saved["data"]["stream"]["bad_samples_skipped"] == stream["bad_samples_skipped"]


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"stream": "maybe"}, "data.stream must be true, false or \"auto\", got 'maybe'"),
        ({"workers": -1}, "data.workers must be between 0 (decode in the training process) and 64, got -1"),
        ({"on_bad_file": "ignore"}, "unknown data.on_bad_file 'ignore'; choose one of ['error', 'skip']"),
        (
            {"memory_budget": "lots"},
            "data.memory_budget must be a positive size such as 4GB or 500MB, got 'lots'",
        ),
    ],
)
def test_bad_stream_settings_are_named(folder, setting, message):
    with pytest.raises(ConfigError) as e:
        build(_cfg(folder, **setting))
    assert str(e.value) == message


def test_cli_streams_from_set_options_and_a_corrupt_file_exits_1_naming_it(tmp_path):
    from click.testing import CliRunner

    from fedxrisk.cli import main

    data = tmp_path / "images"
    write_image_folder(data, per_class=12, size=8)
    _corrupt(data / "a" / "004.png")
    out = tmp_path / "run"
    args = ["run", "--dataset", "folder", "--data-dir", str(data), "-K", "2", "--imratio", "none",
            "--partition", "iid", "--rounds", "2", "--stages", "1", "-I", "2", "--batch-size", "4",
            "--set", "data.stream=true", "--set", "data.workers=0", "--set", 'data.positive_classes=["b"]',
            "--out", str(out), "-q"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert f"corrupt or unreadable data file {data / 'a' / '004.png'}" in text
    assert f"continue with `fedxrisk run --resume {out}`" in text
    assert (out / "config.toml").exists() and not (out / "summary.json").exists()
    assert "stream = true" in (out / "config.toml").read_text()
