"""Tensor augmentation: crops equal slices of the padded image, flips mirror, same seed ⇒ same batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedxrisk.data import make_federated
from fedxrisk.data.augment import RandomCropFlip, crop, flip


def test_crop_is_a_slice_of_the_zero_padded_image():
    x = torch.arange(2 * 3 * 5 * 6, dtype=torch.float32).reshape(2, 3, 5, 6)
    dy, dx = torch.tensor([0, 3]), torch.tensor([4, 1])
    out = crop(x, 2, dy, dx)
    padded = F.pad(x, (2, 2, 2, 2))
    for i in range(2):
        torch.testing.assert_close(out[i], padded[i, :, dy[i] : dy[i] + 5, dx[i] : dx[i] + 6], rtol=0, atol=0)
    torch.testing.assert_close(crop(x, 2, torch.tensor([2, 2]), torch.tensor([2, 2])), x, rtol=0, atol=0)


def test_flip_and_reproducibility():
    x = torch.rand(4, 1, 3, 3)
    out = flip(x, torch.tensor([True, False, True, False]))
    assert torch.equal(out[0], x[0].flip(-1)) and torch.equal(out[1], x[1])
    a, b = RandomCropFlip(2, seed=5), RandomCropFlip(2, seed=5)
    batch = torch.rand(3, 4, 1, 8, 8)  # clients × batch × image
    first = a(batch)
    assert first.shape == batch.shape and torch.equal(first, b(batch))
    assert not torch.equal(first, a(batch))  # the stream moves on
    assert torch.equal(RandomCropFlip(0, flip_prob=0.0)(batch), batch)
    with pytest.raises(ValueError, match="needs images"):
        a(torch.rand(4, 8))


def test_federated_batches_are_augmented():
    fed = make_federated("digits", 2, "iid", 0.3, 0)
    positions = np.zeros((2, 4), dtype=np.int64)
    plain = fed.batch(positions)["x"]
    fed.augment = RandomCropFlip(padding=2, flip_prob=1.0, seed=0)
    augmented = fed.batch(positions)["x"]
    assert augmented.shape == plain.shape and not torch.equal(augmented, plain)
    # every augmented image is a flipped crop: its pixel sum never exceeds the original's
    assert bool((augmented.sum((-1, -2, -3)) <= plain.sum((-1, -2, -3)) + 1e-5).all())
