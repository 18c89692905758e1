"""data.cache: a streamed run reading decoded images from one memory-mapped file equals the in-memory
run, decodes each file once, and never trusts a stale or truncated cache."""

from __future__ import annotations

import os
import pickle
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import fedxrisk.data.cache as cache_module
import fedxrisk.data.lazy as lazy_module
from fedxrisk.cli import main
from fedxrisk.data.augment import RandomCropFlip
from fedxrisk.data.cache import CachedImages
from fedxrisk.experiment import ConfigError, RunConfig, build, run_experiment
from helpers import max_abs_diff, run_all, write_image_folder

FILES = 48  # write_image_folder(per_class=24): 33 training and 15 test images, one source


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root, per_class=24, size=8)
    return root


@pytest.fixture
def decodes(monkeypatch) -> list[str]:
    """Every image file decoded in this process (ImageFiles reads through lazy.load_image)."""
    calls: list[str] = []
    real = lazy_module.load_image

    def counting(path, *args, **kwargs):
        calls.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(lazy_module, "load_image", counting)
    return calls


def _cfg(root, **kw) -> RunConfig:
    base = dict(algorithm="codasca", dataset="folder", data_dir=str(root), clients=3, imratio=None,
                partition="iid", model="mlp", rounds=3, stages=1, local_steps=2, batch_size=6, engine="loop",
                stream=True, workers=1, eval_every=1, tensorboard=False, positive_classes=["b"])  # fmt: skip
    return RunConfig(**{**base, **kw})


def _cache_files(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir()) if where.exists() else []


@pytest.mark.slow  # a whole streamed run; the cache's quick siblings below cover reading and rebuilding it
def test_streamed_cached_run_equals_in_memory_run_with_augmentation(folder, tmp_path):
    runs = {}
    for name, kw in (("memory", {"stream": False}), ("cached", {"cache": str(tmp_path / "cache")})):
        setup = build(_cfg(folder, **kw))
        setup.data.augment = RandomCropFlip(padding=4, seed=3)  # the same draws on both paths
        runs[name] = (setup, run_all(setup.simulation))
    (_, memory), (cached_setup, cached) = runs["memory"], runs["cached"]
    assert isinstance(cached_setup.data.data.x_train.source, CachedImages)
    assert isinstance(cached_setup.data.data.x_test.source, CachedImages)
    stream = cached_setup.data.stream
    assert stream.misses == 0 and stream.augmented_by_workers > 0  # the worker read the mapped file
    assert max_abs_diff(memory.states, cached.states) < 1e-5


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_the_second_run_reads_the_cache_and_decodes_no_file(folder, tmp_path, decodes, capsys):
    where = tmp_path / "cache"
    cfg = _cfg(folder, cache=str(where), workers=0, checkpoint_every=0)
    first = run_experiment(cfg, tmp_path / "one").summary
    assert len(decodes) == FILES and len(set(decodes)) == FILES  # each file once, up front
    [info] = first["data"]["stream"]["cache"]
    assert info["built"] and info["images"] == FILES and Path(info["path"]).parent == where
    assert info["bytes"] > FILES * 3 * 32 * 32  # pixels at the folder's default 32×32, plus framing
    assert f"data.cache: decoding {FILES} images once into {info['path']}" in capsys.readouterr().err
    decodes.clear()
    second = run_experiment(cfg, tmp_path / "two").summary
    assert decodes == []  # training and evaluation read the mapped file
    assert second["data"]["stream"]["cache"] == [{**info, "built": False}]
    assert second["final"] == first["final"]
    uncached = run_experiment(_cfg(folder, workers=0, checkpoint_every=0), tmp_path / "three").summary
    assert len(decodes) > FILES  # without the cache every sampled image is decoded again
    assert uncached["final"] == first["final"]


def test_a_changed_file_list_image_size_or_file_makes_a_new_cache(folder, tmp_path, decodes):
    where = tmp_path / "cache"
    build(_cfg(folder, cache=str(where)))
    [name] = _cache_files(where)
    build(_cfg(folder, cache=str(where), image_size=16))
    assert len(_cache_files(where)) == 2 and len(decodes) == 2 * FILES
    extra = folder / "a" / "900.png"
    shutil.copy(folder / "a" / "000.png", extra)
    build(_cfg(folder, cache=str(where)))
    assert len(_cache_files(where)) == 3 and len(decodes) == 3 * FILES + 1
    extra.unlink()
    # the same files, one of them rewritten: the same cache file, rebuilt from the new pixels
    victim = folder / "b" / "003.png"
    Image.fromarray(np.full((8, 8, 3), 7, np.uint8)).save(victim)
    later = victim.stat().st_mtime + 5
    os.utime(victim, (later, later))
    decodes.clear()
    setup = build(_cfg(folder, cache=str(where)))
    assert setup.stream.cache[0]["built"] and Path(setup.stream.cache[0]["path"]).name == name
    assert len(decodes) == FILES and len(_cache_files(where)) == 3
    source = setup.data.data.x_train.source
    assert np.all(source.decode(source.paths.index(str(victim))) == np.float32(7) / np.float32(255))


def test_a_truncated_cache_is_detected_and_rebuilt(folder, tmp_path, decodes, capsys):
    where = tmp_path / "cache"
    reference = build(_cfg(folder, stream=True)).data.data.x_train.decode()
    # no worker may be reading the file while it is cut short: a mapped page past the end is SIGBUS
    build(_cfg(folder, cache=str(where), workers=0)).data.stream.close()
    [name] = _cache_files(where)
    path = where / name
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    capsys.readouterr()
    decodes.clear()
    setup = build(_cfg(folder, cache=str(where), workers=0))
    assert f"data.cache: {name} is incomplete or stale: decoding {FILES} images" in capsys.readouterr().err
    assert setup.stream.cache[0]["built"] and len(decodes) == FILES and path.stat().st_size == size
    assert max_abs_diff(setup.data.data.x_train.decode(), reference) == 0.0


def test_the_default_cache_folder_is_the_user_cache_not_the_data_folder(folder, tmp_path, monkeypatch):
    monkeypatch.delenv(cache_module.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    before = sorted(str(p) for p in folder.rglob("*"))
    setup = build(_cfg(folder, cache=True))
    assert sorted(str(p) for p in folder.rglob("*")) == before
    assert Path(setup.stream.cache[0]["path"]).parent == tmp_path / "xdg" / "fedxrisk" / "images"
    monkeypatch.setenv(cache_module.CACHE_ENV, str(tmp_path / "mine"))
    assert Path(build(_cfg(folder, cache=True)).stream.cache[0]["path"]).parent == tmp_path / "mine"


def test_a_cache_that_does_not_fit_is_one_line_and_exit_2(folder, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(cache_module.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    where, out = tmp_path / "cache", tmp_path / "run"
    args = ["run", "--dataset", "folder", "--data-dir", str(folder), "-K", "2", "--imratio", "none",
            "--partition", "iid", "--rounds", "1", "--set", "data.stream=true", "--set", f"data.cache={where}",
            "--set", 'data.positive_classes=["b"]', "--out", str(out), "-q"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"Error: data.cache: {FILES} decoded images need 1.2 MB in {where}, which has 0.0 MB free; free some "
        "space, point data.cache at another folder, or set data.cache = false"
    ]
    assert not out.exists() and _cache_files(where) == []


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            {"cache": "none"},
            "data.cache must be false (decode every time), true (the user cache folder) or a "
            "folder path, got 'none'",
        ),  # fmt: skip
        (
            {"cache": True, "stream": False},
            "data.cache serves streamed runs; with data.stream = false the images "
            'are decoded into memory anyway: set data.stream = true or "auto", '
            "or data.cache = false",
        ),  # fmt: skip
        (
            {"cache": True, "dataset": "digits", "data_dir": None, "positive_classes": None},
            "data.cache keeps decoded images of ['folder', 'sites', 'manifest', 'chexpert', 'chestxray_ih'], "
            "not of 'digits'",
        ),  # fmt: skip
    ],
)
def test_bad_cache_settings_are_named(folder, setting, message):
    with pytest.raises(ConfigError) as e:
        build(_cfg(folder, **setting))
    assert str(e.value) == message


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_an_undecodable_file_is_skipped_as_without_the_cache(tmp_path):
    data = tmp_path / "images"
    write_image_folder(data, per_class=24, size=8)
    victim = data / "a" / "002.png"
    victim.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    kw = dict(on_bad_file="skip", workers=0, checkpoint_every=0)
    plain = run_experiment(_cfg(data, **kw), tmp_path / "plain").summary
    cached = run_experiment(_cfg(data, cache=str(tmp_path / "cache"), **kw), tmp_path / "cached").summary
    assert cached["final"] == plain["final"]
    assert cached["data"]["stream"]["bad_files"] == plain["data"]["stream"]["bad_files"] == [str(victim)]
    assert (
        cached["data"]["stream"]["bad_samples_skipped"] == plain["data"]["stream"]["bad_samples_skipped"] > 0
    )


def test_a_cached_source_pickles_without_its_mapping(folder, tmp_path):
    x = build(_cfg(folder, cache=str(tmp_path / "cache"))).data.data.x_train
    source = x.source
    source.pixels()  # mapped in this process
    copy = pickle.loads(pickle.dumps(source))  # what a spawned worker receives
    assert copy._map is None  # noqa: SLF001 - the worker maps the file itself
    assert np.array_equal(copy.decode(int(x.rows[0])), source.decode(int(x.rows[0])))


def test_a_batch_read_at_once_equals_the_samples_one_by_one(folder, tmp_path):
    source = build(_cfg(folder, cache=str(tmp_path / "cache"))).data.data.x_train.source
    rows = np.array([[5, 0, 5], [47, 12, 3]])
    one_by_one = np.stack([np.stack([source.decode(int(r)) for r in row]) for row in rows])
    assert np.array_equal(source.decode_many(rows), one_by_one) and one_by_one.shape == (2, 3, 3, 32, 32)
    source.bad = {12: "broken"}  # a row that could not be decoded: the caller's bad-file policy decides
    assert source.decode_many(rows) is None and source.decode_many(rows[:1]) is not None


def _open_in_process(args) -> bool:
    paths, where = args
    from fedxrisk.data.cache import open_cache
    from fedxrisk.data.lazy import ImageFiles

    return open_cache(ImageFiles(paths, 16), Path(where))[1]["built"]


def test_concurrent_runs_build_one_cache_between_them(folder, tmp_path):
    import multiprocessing

    paths = sorted(str(p) for p in folder.rglob("*.png"))
    with multiprocessing.get_context("fork").Pool(3) as pool:  # as torchrun ranks opening the same data
        built = pool.map(_open_in_process, [(paths, str(tmp_path / "cache"))] * 3)
    assert sorted(built) == [False, False, True] and len(_cache_files(tmp_path / "cache")) == 1
