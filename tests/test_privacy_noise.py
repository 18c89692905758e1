"""The DP noise source (engines/privacy/noise.py, issue 30): secret by default, fine-grained
float64 Gaussians (no 2^24 lattice: Mironov's floating-point attack), exactly N(0, std²)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

from fedxrisk.engines.privacy.noise import NoiseSource


def test_uniforms_carry_53_random_bits():
    u = NoiseSource.reproducible(1).uniform(100_000)
    k = u * 2.0**53 - 1.0
    assert np.array_equal(k, np.round(k))  # on the 2^-53 grid, exactly
    low = k.astype(np.uint64)
    # every one of the 53 bits varies: the lowest 29 bits are what a float32 uniform lacks
    bits = [int(((low >> np.uint64(b)) & np.uint64(1)).sum()) for b in range(53)]
    assert all(40_000 < ones < 60_000 for ones in bits), bits


def test_gaussian_has_no_coarse_lattice_and_no_repeats():
    z = NoiseSource.reproducible(2).gaussian((200_000,), 1.0, dtype=torch.float64).numpy()
    # ndtri of float32 uniforms: ≤ 2^24 levels → ~1,000 repeats expected among 2·10^5 draws
    assert len(np.unique(z)) == len(z)
    # nor a grid of step 2^-24 or 2^-30 (values off every such grid)
    for step in (2.0**-24, 2.0**-30):
        assert np.mean(z / step == np.round(z / step)) < 0.01
    # resolution: near 0 the draws still differ below 2^-40
    near = np.sort(np.abs(z[np.abs(z) < 0.5]))
    assert np.min(np.diff(near)) < 2.0**-20
    assert np.mean((np.abs(z) * 2.0**40) % 1 != 0) > 0.99


def test_gaussian_is_normal_with_the_requested_std():
    std = 2.5
    z = NoiseSource.reproducible(3).gaussian((100_000,), std, dtype=torch.float64).numpy()
    assert stats.kstest(z / std, "norm").pvalue > 1e-3
    assert abs(z.std() / std - 1) < 0.01 and abs(z.mean()) < 0.03
    # the check can fail: a wrong std is rejected
    assert stats.kstest(z / (1.05 * std), "norm").pvalue < 1e-6


def test_reproducible_mode_repeats_secret_mode_does_not():
    a = NoiseSource.reproducible(7).spawn(3, 1).gaussian((50,), 1.0)
    b = NoiseSource.reproducible(7).spawn(3, 1).gaussian((50,), 1.0)
    assert torch.equal(a, b)
    assert not torch.equal(a, NoiseSource.reproducible(7).spawn(3, 2).gaussian((50,), 1.0))
    assert not torch.equal(a, NoiseSource.reproducible(8).spawn(3, 1).gaussian((50,), 1.0))
    s1, s2 = NoiseSource.secret(), NoiseSource.secret()
    assert s1.private and s2.private and not NoiseSource.reproducible(7).private
    assert not torch.equal(s1.spawn(0).gaussian((50,), 1.0), s2.spawn(0).gaussian((50,), 1.0))
    # successive draws of one stream differ; a spawn starts its stream afresh
    assert not torch.equal(s1.gaussian((50,), 1.0), s1.gaussian((50,), 1.0))
    assert torch.equal(s1.spawn(4).gaussian((5,), 1.0), s1.spawn(4).gaussian((5,), 1.0))


def test_a_source_is_never_saved(tmp_path):
    source = NoiseSource.secret()
    assert "secret" in repr(source)
    for save in (pickle.dumps, copy.deepcopy, lambda s: torch.save(s, tmp_path / "x.pt")):
        with pytest.raises(TypeError, match="never saved"):
            save(source)


def test_shape_dtype_device_and_bad_std():
    x = NoiseSource.reproducible(0).gaussian(torch.Size([3, 4]), 0.5)
    assert x.shape == (3, 4) and x.dtype == torch.float32
    assert NoiseSource.reproducible(0).gaussian((0,), 1.0).numel() == 0
    assert torch.equal(NoiseSource.reproducible(0).gaussian((4,), 0.0), torch.zeros(4))
    with pytest.raises(ValueError, match="std"):
        NoiseSource.reproducible(0).gaussian((2,), -1.0)
