"""Data: exact imbalance counts, partitions, samplers, and their error messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedxrisk.data import (
    BinaryData,
    ClientSampler,
    binarize,
    imbalance_counts,
    load_dataset,
    make_federated,
    make_imbalanced,
    partition,
)


@pytest.mark.parametrize("imratio", [0.01, 0.05, 0.1, 0.2, 0.4])
def test_imbalance_keeps_exact_counts_and_all_negatives(imratio):
    y = np.array([1] * 400 + [0] * 600)
    kept = make_imbalanced(y, imratio, np.random.default_rng(0))
    n_pos, n_neg = int(y[kept].sum()), int((y[kept] == 0).sum())
    assert n_neg == 600
    assert n_pos == round(imratio * 600 / (1 - imratio))
    assert abs(n_pos / (n_pos + n_neg) - imratio) < 1 / 600


def test_imbalance_drops_negatives_when_positives_are_scarce():
    assert imbalance_counts(num_pos=50, num_neg=950, imratio=0.2) == (50, 200)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_imratio_outside_unit_interval_is_rejected(bad):
    with pytest.raises(ValueError, match=r"imratio must lie in \(0, 1\)"):
        make_imbalanced(np.array([0, 1, 1]), bad, np.random.default_rng(0))


def test_test_set_is_left_unchanged():
    raw = binarize(load_dataset("digits"))
    fed = make_federated("digits", 4, "class", 0.1, seed=3)
    assert torch.equal(fed.data.y_test, raw.y_test)
    assert torch.equal(fed.data.x_test, raw.x_test)
    assert abs(fed.data.pos_ratio - 0.1) < 0.01


def test_default_positive_classes_are_the_second_half():
    data = binarize(load_dataset("digits"))
    assert data.positive_classes == (5, 6, 7, 8, 9)
    assert torch.equal(
        data.y_train, torch.from_numpy(np.isin(data.classes_train, [5, 6, 7, 8, 9]).astype(np.float32))
    )


@pytest.mark.parametrize("clients", [2, 3, 5])
def test_class_partition_gives_disjoint_classes(clients):
    fed = make_federated("digits", clients, "class", 0.3, seed=0)
    classes = [set(fed.data.classes_train[s].tolist()) for s in fed.shards]
    for i in range(clients):
        for j in range(i + 1, clients):
            assert not classes[i] & classes[j], (i, j, classes)
    all_idx = np.concatenate(fed.shards)
    assert sorted(all_idx.tolist()) == list(range(len(fed.data.y_train)))  # a partition: each sample once
    for s in fed.shards:  # every client holds both labels
        y = fed.data.y_train[torch.from_numpy(s)]
        assert 0 < y.sum() < len(y)


def test_class_partition_with_more_clients_than_classes_splits_classes():
    y = np.array([1] * 30 + [0] * 60)
    classes = np.array([7] * 30 + [0] * 30 + [1] * 30)
    parts = partition("class", y, classes, 4, np.random.default_rng(0))
    # one positive class over 4 clients: each gets 7 or 8 of its 30 samples
    assert sorted(int(y[p].sum()) for p in parts) == [7, 7, 8, 8]
    # two negative classes over 4 clients: clients 0,1 share class 0; clients 2,3 share class 1
    neg_classes = [set(classes[p][y[p] == 0].tolist()) for p in parts]
    assert neg_classes == [{0}, {0}, {1}, {1}]
    assert sorted(np.concatenate(parts).tolist()) == list(range(90))


def test_dirichlet_partition_is_a_partition_with_label_skew():
    fed = make_federated(
        "synthetic", 6, "dirichlet", 0.3, seed=1, dirichlet_alpha=0.3, allow_missing_class=True
    )
    all_idx = np.concatenate(fed.shards)
    assert sorted(all_idx.tolist()) == list(range(len(fed.data.y_train)))
    ratios = [fed.client_pos_ratio(k) for k in range(6)]
    assert max(ratios) - min(ratios) > 0.2  # skewed, unlike iid


def test_iid_partition_sizes_differ_by_at_most_one():
    parts = partition("iid", np.zeros(103), np.zeros(103), 5, np.random.default_rng(0))
    assert sorted(len(p) for p in parts) == [20, 20, 21, 21, 21]


def test_partition_is_reproducible_from_the_seed():
    a = make_federated("digits", 4, "dirichlet", 0.2, seed=5, allow_missing_class=True)
    b = make_federated("digits", 4, "dirichlet", 0.2, seed=5, allow_missing_class=True)
    assert all(np.array_equal(x, y) for x, y in zip(a.shards, b.shards))


def test_more_clients_than_samples_is_rejected():
    with pytest.raises(ValueError, match="5 clients but only 3 training samples"):
        partition("iid", np.array([0, 1, 0]), np.array([0, 1, 0]), 5, np.random.default_rng(0))


def test_client_without_positives_is_an_error_unless_allowed():
    # imratio 0.01 keeps ~9 positives: with 16 iid clients some receive none
    with pytest.raises(ValueError, match=r"client\(s\) hold only one class \(client \d+: 0 pos"):
        make_federated("digits", 16, "iid", 0.01, seed=0)
    with pytest.warns(UserWarning, match="hold only one class"):
        fed = make_federated("digits", 16, "iid", 0.01, seed=0, allow_missing_class=True)
    assert any(pos == 0 for pos, _ in fed.client_counts())


def test_non_binary_labels_are_rejected():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"labels must be binary \(0/1\); found values \[0.0, 1.0, 2.0\]"):
        BinaryData(
            "mine", x, torch.tensor([0.0, 1.0, 2.0]), x, torch.tensor([0.0, 1.0, 1.0]), np.zeros(3), (1,)
        )


def test_unknown_dataset_and_positive_class_are_named():
    with pytest.raises(ValueError, match="unknown dataset 'cifar99'"):
        load_dataset("cifar99")
    with pytest.raises(ValueError, match=r"positive classes \[12\] do not exist"):
        binarize(load_dataset("digits"), [12])


def test_sampler_walks_permutations_without_replacement_and_is_seeded():
    s1 = ClientSampler([5, 7], batch_size=5, seed=9)
    rows = [s1.next() for _ in range(7)]  # client 1: 35 draws = 5 full epochs of 7
    client1 = np.concatenate([r[1] for r in rows])
    for epoch in range(5):
        assert sorted(client1[epoch * 7 : (epoch + 1) * 7].tolist()) == list(range(7))
    s2 = ClientSampler([5, 7], batch_size=5, seed=9)
    assert all(np.array_equal(r, s2.next()) for r in rows)


def test_class_aware_samplers_need_labels_and_draw_positives_first():
    from fedxrisk.data.sampler import make_samplers

    with pytest.raises(ValueError, match="need the shards' labels"):
        make_samplers([6], batch_size=4, seed=0, positives=2)
    labels = [np.array([1, 0, 0, 1, 0, 0])]
    train, aux = make_samplers([6], batch_size=4, seed=0, positives=2, shard_labels=labels)
    batch = train.next()[0]
    assert labels[0][batch].tolist() == [1, 1, 0, 0]
    assert aux.sample(3).shape == (1, 3)
