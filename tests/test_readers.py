"""File readers: tiny files written in each real format, read back exactly; bad files give the documented errors."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fedxrisk.data import load_dataset, make_federated
from fedxrisk.data.readers import (
    DataFileError,
    MissingDataError,
    read_chexpert,
    read_cifar10,
    read_cifar100,
    read_fashion_mnist,
    read_image_folder,
    read_manifest,
    read_mnist,
    read_npz,
    read_site_folders,
    read_stl10,
    read_tabular_csv,
)
from helpers import idx_bytes

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------- CIFAR ----
def _cifar_batch(
    n: int, label_key: str = "labels", classes: int = 10
) -> tuple[bytes, np.ndarray, np.ndarray]:
    data = RNG.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = RNG.integers(0, classes, size=n)
    raw = pickle.dumps({b"batch_label": b"x", b"data": data, label_key.encode(): labels.tolist()}, protocol=2)
    return raw, data, labels


def _write_tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def test_cifar10_two_batch_archive_reads_exactly(tmp_path):
    (b1, d1, l1), (b2, d2, l2), (bt, dt, lt) = _cifar_batch(5), _cifar_batch(4), _cifar_batch(3)
    members = {"cifar-10-batches-py/data_batch_1": b1, "cifar-10-batches-py/data_batch_2": b2}
    _write_tar(tmp_path / "cifar-10-python.tar.gz", {**members, "cifar-10-batches-py/test_batch": bt})
    data = read_cifar10(tmp_path)
    expected = np.concatenate([d1, d2]).reshape(-1, 3, 32, 32).astype(np.float32) / 255
    assert data.x_train.shape == (9, 3, 32, 32) and data.x_train.dtype == np.float32
    np.testing.assert_array_equal(data.x_train, expected)
    np.testing.assert_array_equal(data.y_train, np.concatenate([l1, l2]))
    np.testing.assert_array_equal(data.x_test, dt.reshape(-1, 3, 32, 32).astype(np.float32) / 255)
    np.testing.assert_array_equal(data.y_test, lt)
    # the extracted folder gives the same arrays
    folder = tmp_path / "x" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, raw in {"data_batch_1": b1, "data_batch_2": b2, "test_batch": bt}.items():
        (folder / name).write_bytes(raw)
    again = load_dataset("cifar10", str(tmp_path / "x"))
    np.testing.assert_array_equal(again.x_train, data.x_train)


def test_cifar100_fine_labels(tmp_path):
    (tr, dtr, ltr), (te, _, lte) = _cifar_batch(6, "fine_labels", 100), _cifar_batch(2, "fine_labels", 100)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    (folder / "train").write_bytes(tr)
    (folder / "test").write_bytes(te)
    data = read_cifar100(tmp_path)
    assert data.num_classes == 100
    np.testing.assert_array_equal(data.y_train, ltr)
    np.testing.assert_array_equal(data.y_test, lte)
    np.testing.assert_array_equal(data.x_train[2, 1], dtr[2, 1024:2048].reshape(32, 32) / np.float32(255))


def test_cifar_errors(tmp_path):
    with pytest.raises(MissingDataError, match="cifar-10-batches-py"):
        read_cifar10(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"garbage")
    (folder / "test_batch").write_bytes(_cifar_batch(2)[0])
    with pytest.raises(DataFileError, match="not a CIFAR python batch"):
        read_cifar10(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    (folder / "data_batch_1").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(DataFileError, match="refusing to load builtins.print"):
        read_cifar10(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cifar-10-python.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(DataFileError, match="not a readable tar archive"):
        read_cifar10(tmp_path / "bad")


# ---------------------------------------------------------------- STL-10 ---
def test_stl10_column_major_images_and_labels(tmp_path):
    images = RNG.integers(0, 256, size=(3, 3, 96, 96), dtype=np.uint8)
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    for split, imgs, labels in (("train", images, [1, 10, 5]), ("test", images[:2], [2, 3])):
        (folder / f"{split}_X.bin").write_bytes(np.ascontiguousarray(imgs.transpose(0, 1, 3, 2)).tobytes())
        (folder / f"{split}_y.bin").write_bytes(np.array(labels, dtype=np.uint8).tobytes())
    data = read_stl10(tmp_path)
    np.testing.assert_array_equal(data.x_train, images.astype(np.float32) / 255)
    np.testing.assert_array_equal(data.y_train, [0, 9, 4])
    np.testing.assert_array_equal(data.y_test, [1, 2])
    (folder / "test_X.bin").write_bytes(b"\0" * 100)
    with pytest.raises(DataFileError, match="not a multiple of 3×96×96"):
        read_stl10(tmp_path)
    (folder / "test_y.bin").unlink()
    with pytest.raises(MissingDataError, match="test_y.bin"):
        read_stl10(tmp_path)


# ---------------------------------------------------------------- IDX ------
def _write_mnist(root: Path, gz: bool) -> dict[str, np.ndarray]:
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (4, 28, 28)),
        "train-labels-idx1-ubyte": np.array([3, 1, 4, 1]),
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (2, 28, 28)),
        "t10k-labels-idx1-ubyte": np.array([5, 9]),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        raw = idx_bytes(a)
        if gz and "images" in name:  # mixed: gzipped images, plain labels
            (root / (name + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (root / name).write_bytes(raw)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_idx_pair_reads_exactly(tmp_path, gz):
    arrays = _write_mnist(tmp_path / "FashionMNIST" / "raw", gz)
    data = read_fashion_mnist(tmp_path)
    assert data.x_train.shape == (4, 1, 28, 28)
    np.testing.assert_array_equal(
        data.x_train[:, 0], arrays["train-images-idx3-ubyte"].astype(np.float32) / 255
    )
    np.testing.assert_array_equal(data.y_train, [3, 1, 4, 1])
    np.testing.assert_array_equal(data.y_test, [5, 9])


def test_idx_errors(tmp_path):
    _write_mnist(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataFileError, match="bad magic"):
        read_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([5, 9]))[:-1])
    with pytest.raises(DataFileError, match="announces shape"):
        read_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([5, 9, 1])))
    with pytest.raises(DataFileError, match="2 labels|with N labels"):
        read_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(MissingDataError, match="t10k-labels-idx1-ubyte"):
        read_mnist(tmp_path)


# ---------------------------------------------------------- image folders --
def _png(path: Path, value: int, size: int = 4) -> np.ndarray:
    from PIL import Image

    arr = np.full((size, size, 3), value, dtype=np.uint8)
    arr[0, 0] = (value, 255 - value, 7)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return arr.transpose(2, 0, 1).astype(np.float32) / 255


def test_image_folder_train_test_tree(tmp_path):
    expected = {}
    for split in ("train", "test"):
        for cls, base in (("cat", 10), ("dog", 200)):
            for i in range(2 if split == "train" else 1):
                expected[(split, cls, i)] = _png(tmp_path / split / cls / f"{i}.png", base + i)
    data = read_image_folder(tmp_path, image_size=None)
    assert data.label_names == ("cat", "dog") and data.num_classes == 2
    np.testing.assert_array_equal(data.y_train, [0, 0, 1, 1])
    np.testing.assert_array_equal(data.x_train[2], expected[("train", "dog", 0)])
    np.testing.assert_array_equal(data.x_test[1], expected[("test", "dog", 0)])
    assert read_image_folder(tmp_path, image_size=2).x_train.shape == (4, 3, 2, 2)


def test_image_folder_errors(tmp_path):
    _png(tmp_path / "train" / "cat" / "0.png", 1)
    with pytest.raises(MissingDataError, match="only one of train/ and test/"):
        read_image_folder(tmp_path)
    (tmp_path / "test" / "cat").mkdir(parents=True)
    (tmp_path / "test" / "cat" / "x.png").write_bytes(b"not a png")
    with pytest.raises(DataFileError, match="need ≥ 2 classes"):
        read_image_folder(tmp_path)
    _png(tmp_path / "train" / "dog" / "0.png", 2)
    with pytest.raises(DataFileError, match="cannot decode image"):
        read_image_folder(tmp_path)


def test_site_folders_give_one_client_per_site(tmp_path):
    for site, n in (("hospA", 4), ("hospB", 6)):
        for cls in ("benign", "malignant"):
            for i in range(n):
                _png(tmp_path / site / cls / f"{i}.png", i)
    data = read_site_folders(tmp_path, image_size=None)
    sources = data.groups_train["source"]
    assert len(data.y_train) + len(data.y_test) == 20
    assert np.bincount(sources).tolist() == [5, 8]  # 70% of hospA's 8 and hospB's 12 images
    assert len(data.y_test) == 7
    fed = make_federated("sites", 2, "source", None, 0, ["malignant"], data_dir=str(tmp_path))
    np.testing.assert_array_equal(fed.shards[0], np.flatnonzero(sources == 0))
    np.testing.assert_array_equal(fed.shards[1], np.flatnonzero(sources == 1))


# ------------------------------------------------------- CSV manifests -----
def _manifest(tmp_path: Path) -> Path:
    rows = [
        "path,source,patient,Edema,Atelectasis",
        "img/0.png,A,p1,1,0",
        "img/1.png,A,p1,-1,1",
        "img/2.png,A,p2,0,",
        "img/3.png,B,p3,1,-1",
        "img/4.png,B,p4,0,1",
        "img/5.png,B,p5,,0",
    ]
    for i in range(6):
        _png(tmp_path / "img" / f"{i}.png", 10 * i)
    (tmp_path / "manifest.csv").write_text("\n".join(rows) + "\n")
    return tmp_path / "manifest.csv"


@pytest.mark.parametrize(
    "policy, kept, labels",
    [
        ("ones", [0, 1, 2, 3, 4, 5], [[1, 0], [1, 1], [0, 0], [1, 1], [0, 1], [0, 0]]),
        ("zeros", [0, 1, 2, 3, 4, 5], [[1, 0], [0, 1], [0, 0], [1, 0], [0, 1], [0, 0]]),
        ("ignore", [0, 2, 4, 5], [[1, 0], [0, 0], [0, 1], [0, 0]]),
    ],
)
def test_chexpert_style_manifest_uncertain_policies(tmp_path, policy, kept, labels):
    path = _manifest(tmp_path)
    t_split = ["train" if i % 3 else "test" for i in range(6)]
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0] + ",split"] + [r + "," + s for r, s in zip(text[1:], t_split)]) + "\n")
    data = read_manifest(path, uncertain=policy, image_size=None)
    assert data.label_names == ("Edema", "Atelectasis") and data.num_classes == 2
    train = [i for i in kept if t_split[i] == "train"]
    test = [i for i in kept if t_split[i] == "test"]
    lab = dict(zip(kept, labels))
    np.testing.assert_array_equal(data.y_train, [lab[i] for i in train])
    np.testing.assert_array_equal(data.y_test, [lab[i] for i in test])
    assert data.y_train.dtype == np.float32
    np.testing.assert_array_equal(data.x_train[:, 0, 1, 1], [10 * i / np.float32(255) for i in train])


def test_manifest_patient_disjoint_split_and_errors(tmp_path):
    path = _manifest(tmp_path)
    data = read_manifest(path, image_size=None, test_fraction=0.4)
    patients = ["p1", "p1", "p2", "p3", "p4", "p5"]
    rows = {
        split: np.rint(getattr(data, f"x_{split}")[:, 0, 1, 1] * 255 / 10).astype(int)
        for split in ("train", "test")
    }
    assert sorted([*rows["train"], *rows["test"]]) == list(range(6))
    train_p, test_p = {patients[i] for i in rows["train"]}, {patients[i] for i in rows["test"]}
    assert not train_p & test_p  # no patient on both sides
    # 40% of each source's patients (rounded, at least one) is held out: 1 of A's 2, 1 of B's 3
    assert len(test_p & {"p1", "p2"}) == 1 and len(test_p & {"p3", "p4", "p5"}) == 1
    np.testing.assert_array_equal(data.groups_train["source"], [0 if i < 3 else 1 for i in rows["train"]])
    with pytest.raises(DataFileError, match="label column"):
        read_manifest(path, label_columns=["Cardiomegaly"], image_size=None)
    path.write_text("path,Edema,Effusion\nimg/0.png,maybe,1\n")
    with pytest.raises(DataFileError, match="not a number"):
        read_manifest(path, image_size=None)
    with pytest.raises(MissingDataError, match="manifest.csv with a header"):
        read_manifest(tmp_path / "nope.csv")


def test_chexpert_layout(tmp_path):
    root = tmp_path / "CheXpert-v1.0-small"
    header = (
        "Path,Sex,Age,Frontal/Lateral,AP/PA,Cardiomegaly,Edema,Consolidation,Atelectasis,Pleural Effusion"
    )
    train = [
        f"CheXpert-v1.0-small/train/patient0000{i}/study1/view1_frontal.jpg,F,50,Frontal,AP,1,-1,,0,-1"
        for i in range(3)
    ]
    valid = ["CheXpert-v1.0-small/valid/patient00009/study1/view1_frontal.jpg,M,40,Frontal,PA,0,1,1,0,0"]
    root.mkdir()
    (root / "train.csv").write_text("\n".join([header, *train]) + "\n")
    (root / "valid.csv").write_text("\n".join([header, *valid]) + "\n")
    for line in train + valid:
        _png(tmp_path / line.split(",")[0], 50)
    data = read_chexpert(root, image_size=8)
    # Edema and Atelectasis: uncertain → 1; Cardiomegaly, Consolidation, Pleural Effusion: → 0
    np.testing.assert_array_equal(data.y_train, [[1, 1, 0, 0, 0]] * 3)
    np.testing.assert_array_equal(data.y_test, [[0, 1, 1, 0, 0]])
    np.testing.assert_array_equal(data.groups_train["patient"], [0, 1, 2])
    assert data.x_train.shape == (3, 3, 8, 8)


# ----------------------------------------------------- npz and tabular -----
def test_npz_multilabel_and_groups(tmp_path):
    y = RNG.integers(0, 2, (6, 3))
    np.savez(tmp_path / "data.npz", x_train=np.ones((6, 2)), y_train=y, x_test=np.zeros((2, 2)),
             y_test=y[:2], source_train=np.array([0, 0, 1, 1, 2, 2]))  # fmt: skip
    data = read_npz(tmp_path)
    assert data.multilabel and data.num_classes == 3
    np.testing.assert_array_equal(data.y_train, y)
    np.testing.assert_array_equal(data.groups_train["source"], [0, 0, 1, 1, 2, 2])
    np.savez(tmp_path / "data.npz", x_train=np.ones((6, 2)), y_train=y)
    with pytest.raises(DataFileError, match=r"missing array\(s\) \['x_test', 'y_test'\]"):
        read_npz(tmp_path)
    (tmp_path / "data.npz").write_bytes(b"junk")
    with pytest.raises(DataFileError, match="not a readable .npz"):
        read_npz(tmp_path)


def test_tabular_csv_standardized_with_train_statistics(tmp_path):
    (tmp_path / "train.csv").write_text("f1,f2,label,source\n1,10,0,a\n3,10,1,b\n5,40,1,a\n")
    (tmp_path / "test.csv").write_text("f1,f2,label,source\n3,20,0,a\n")
    data = read_tabular_csv(tmp_path)
    np.testing.assert_allclose(data.x_train[:, 0], [-1.2247449, 0, 1.2247449], rtol=1e-6)
    np.testing.assert_allclose(data.x_test[0], [0.0, 0.0], atol=1e-6)
    np.testing.assert_array_equal(data.groups_train["source"], [0, 1, 0])
    (tmp_path / "test.csv").write_text("f1,f2,label\n3,x,0\n")
    with pytest.raises(DataFileError, match="test.csv row 2"):
        read_tabular_csv(tmp_path)


def test_registry_needs_data_dir_and_bundled_sets_refuse_one(tmp_path):
    with pytest.raises(MissingDataError, match="set data_dir"):
        load_dataset("cifar10")
    with pytest.raises(MissingDataError, match="does not exist"):
        load_dataset("mnist", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="bundled"):
        load_dataset("digits", str(tmp_path))
    assert load_dataset("digits").num_classes == 10
