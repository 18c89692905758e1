"""Fixtures shared by several test modules: a finished tiny run (and a private copy of it), a
folder of tiny images, and a tmpfs of a given size for full-disk tests.

The ``slow`` marker (pyproject.toml) is on the tests that start real processes (a TLS Flower
federation, torchrun ranks, killed and resumed runs) and on long studies; ``python -m pytest -m
"not slow"`` is the quick subset, ``python -m pytest`` runs everything.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

from helpers import TINY_RUN, write_image_folder

# modules of real processes that take minutes: collected first, so that pytest-xdist (pyproject.toml's
# ``-n auto --dist loadfile``: one module per worker) starts them while other workers take the rest
LONG_FIRST = (
    "test_flower_deploy.py",
    "test_flower_evaluate_deploy.py",
    "test_one_path.py",
    "test_distributed.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of :data:`LONG_FIRST` first, in that order; the rest as collected."""
    rank = {name: k for k, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished run of :data:`helpers.TINY_RUN` (one per module, so no module sees another's
    writes), with ``x.npz`` (five 1×8×8 inputs for ``predict``) next to it."""
    from fedxrisk.experiment import RunConfig, run_experiment

    out = tmp_path_factory.mktemp("finished") / "run"
    run_experiment(RunConfig(**TINY_RUN), out)
    np.savez(out.parent / "x.npz", x=np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32))
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A private copy of :func:`finished_run`, for tests that damage or extend it."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """:func:`helpers.write_image_folder`'s two classes ``a`` and ``b``, 12 8×8 PNGs each."""
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root, per_class=12, size=8)
    return root


@contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "48k") at ``mount``; skips the test unless root may mount it."""
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)]).returncode
    ):
        pytest.skip("needs root to mount a tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs("48k")``: a fresh tmpfs of that size under ``tmp_path`` for a real ENOSPC (root
    only, else the test is skipped), unmounted after the test."""
    with ExitStack() as stack:
        count = itertools.count()

        def mount(size: str) -> Path:
            return stack.enter_context(mounted_tmpfs(tmp_path / f"disk{next(count)}", size))

        yield mount
