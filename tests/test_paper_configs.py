"""configs/papers/*.toml: every key maps to a RunConfig field or an algorithm hyperparameter,
and every config whose algorithm exists runs a few steps on tiny files in the real format."""

from __future__ import annotations

import dataclasses
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.data import DATASETS, PARTITIONS
from fedxrisk.experiment import RunConfig, run_experiment, validate
from fedxrisk.models import MODELS
from helpers import idx_bytes

tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11

CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "papers").glob("*.toml"))
SECTIONS = {
    "experiment": {"seed", "rounds", "eval_every"},
    "data": {"dataset", "imratio", "partition", "clients", "dirichlet_alpha", "positive_classes",
             "batch_size", "allow_missing_class", "data_dir"},
    "model": {"model", "buffer_policy", "init_from", "reset_head"},
    "algorithm": {"algorithm", "lr", "local_steps", "stages", "lr_decay", "window_growth", "pos_ratio_mode"},
    "engine": {"engine", "device"},
}  # fmt: skip
NULLABLE = {
    "imratio",
    "lr",
    "local_steps",
    "positive_classes",
    "data_dir",
}  # "none" → None (TOML has no null)


def load_config(path: Path) -> tuple[dict, dict]:
    """(RunConfig fields, algorithm options) of a paper config; a [pretrain] table is ``fields["pretrain"]``."""
    raw = tomllib.loads(path.read_text())
    assert set(raw) - {"pretrain"} == set(SECTIONS), f"{path.name}: sections {sorted(raw)}"
    fields, options = {}, {}
    if "pretrain" in raw:
        fields["pretrain"] = raw.pop("pretrain")
    for section, values in raw.items():
        for key, value in values.items():
            if key in NULLABLE and value == "none":
                value = None
            if key in SECTIONS[section]:
                fields[key] = value
            elif section == "algorithm":
                options[key] = value
            else:
                raise AssertionError(f"{path.name}: [{section}] {key} is not a field of that section")
    return fields, options


def test_there_is_a_config_per_paper_experiment():
    names = {p.stem for p in CONFIGS}
    assert {
        f"localscgdam_table1_{d}"
        for d in ("cifar10", "cifar100", "stl10", "fashionmnist", "catsdogs", "melanoma")
    } <= names
    assert {
        "codasca_table3_chestxray_ih",
        "codasca_fig1_imagenet_ih_k16",
        "codasca_fig1_cifar100_ih_k16",
    } <= names
    assert {"fcsg_table2_mnist", "fcsg_table2_cifar10", "fedxl1_cifar10", "fedxl2_cifar10"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_keys_are_run_config_fields_and_hyperparameters(path):
    fields, options = load_config(path)
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert set(fields) <= run_fields
    header = path.read_text().split("[experiment]")[0]
    assert "paper" in header and "Data files:" in header  # cites its paper and names the files it reads
    assert fields["dataset"] in DATASETS and fields["model"] in MODELS and fields["partition"] in PARTITIONS
    if fields["algorithm"] not in ALGORITHMS:
        return  # implemented on another branch: structure checked, hyperparameters checked after merge
    cfg = RunConfig(**{**fields, "device": "cpu"}, options=options)
    validate(cfg)  # raises ConfigError on an unknown option or an invalid value
    assert set(options) <= set(ALGORITHMS[cfg.algorithm].hyperparameters())


# ---------------------------------------------- tiny data in the real format ---
def _png(path: Path, seed: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)


def _cifar(root: Path, classes: int, per_class: int) -> None:
    rng = np.random.default_rng(0)
    folder, key = (
        (root / "cifar-100-python", "fine_labels")
        if classes == 100
        else (root / "cifar-10-batches-py", "labels")
    )
    folder.mkdir(parents=True)
    for name in ["train", "test"] if classes == 100 else ["data_batch_1", "test_batch"]:
        labels = np.repeat(np.arange(classes), per_class)
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        (folder / name).write_bytes(pickle.dumps({b"data": data, key.encode(): labels.tolist()}))


def _chestxray(root: Path, sources: int = 5, split: bool = False, patients: int = 8) -> None:
    """With ``split``, half of source 0's patients are the test set (as CheXpert's validation set)."""
    rng = np.random.default_rng(0)
    header = "path,source,patient,Cardiomegaly,Edema,Consolidation,Atelectasis,Pleural Effusion"
    lines = [header + (",split" if split else "")]
    for s in range(sources):
        for p in range(patients):
            for i in range(2):
                path = f"img/{s}_{p}_{i}.png"
                _png(root / path, 100 * s + 10 * p + i)
                labels = ",".join(str(v) for v in rng.choice([1, 0, 0, -1], 5))
                part = ("," + ("test" if s == 0 and p >= patients // 2 else "train")) if split else ""
                lines.append(f"{path},site{s},s{s}p{p},{labels}{part}")
    (root / "manifest.csv").write_text("\n".join(lines) + "\n")


def _stl10(root: Path) -> None:
    """STL-10 binaries: 10 classes × 4 train / 1 test images of 3×96×96, labels 1..10."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for split, per_class in (("train", 4), ("test", 1)):
        labels = np.repeat(np.arange(1, 11), per_class).astype(np.uint8)
        (root / f"{split}_X.bin").write_bytes(
            rng.integers(0, 256, len(labels) * 3 * 96 * 96, dtype=np.uint8).tobytes()
        )
        (root / f"{split}_y.bin").write_bytes(labels.tobytes())


def _melanoma(root: Path) -> None:
    """A Melanoma-style manifest: one binary label column and a train/test split."""
    lines = ["path,target,split"]
    for i in range(40):
        _png(root / "img" / f"{i}.png", i)
        lines.append(f"img/{i}.png,{int(i % 5 == 0)},{'test' if i % 4 == 0 else 'train'}")
    (root / "manifest.csv").write_text("\n".join(lines) + "\n")


def _mnist(root: Path) -> None:
    """IDX files (uncompressed), 10 classes × 6 images of 28×28."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for prefix, per_class in (("train", 6), ("t10k", 2)):
        labels = np.repeat(np.arange(10), per_class).astype(np.uint8)
        images = rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            (root / f"{prefix}-{kind}-ubyte").write_bytes(idx_bytes(array))


def make_tiny(dataset: str, root: Path, fields: dict | None = None) -> None:
    if dataset in ("cifar10", "cifar100"):
        _cifar(root, 10 if dataset == "cifar10" else 100, 6 if dataset == "cifar10" else 3)
    elif dataset == "folder":
        for split, n in (("train", 40), ("test", 4)):
            for c in range(4):
                for i in range(n):
                    _png(root / split / f"class{c}" / f"{i}.png", 1000 * c + i)
    elif dataset == "chestxray_ih" and "fdam_chexpert" in (fields or {}).get("data_dir", ""):
        _chestxray(root, fields["clients"], split=True, patients=4)  # Tables 4-5: K sources, CheXpert valid
    elif dataset == "chestxray_ih":
        _chestxray(root)
    elif dataset in ("mnist", "fashionmnist"):
        _mnist(root)
    elif dataset == "stl10":
        _stl10(root)
    elif dataset == "manifest":
        _melanoma(root)
    else:
        raise AssertionError(f"no tiny generator for {dataset}: add one")


def _weights_for(fields: dict, tmp_path: Path) -> str:
    """A state dict file the config's (smoke) model accepts, in place of the files the user provides."""
    from fedxrisk.experiment import build

    path = tmp_path / "weights.pt"
    torch.save(build(RunConfig(**fields)).problem.model.state_dict(), path)
    return str(path)


RUNNABLE = [p for p in CONFIGS if load_config(p)[0]["algorithm"] in ALGORITHMS]
# the quick subset runs each dataset's config with the fewest clients (each reader's tiny files), but
# none on ResNet-20 (seconds a step on a CPU; test_models_zoo.py covers it); the full suite runs them all
QUICK = {
    min(
        (p for p in RUNNABLE if load_config(p)[0]["dataset"] == d),
        key=lambda p: (load_config(p)[0]["clients"], p.name),
    )
    for d in {load_config(p)[0]["dataset"] for p in RUNNABLE}
}
QUICK = {p for p in QUICK if load_config(p)[0]["model"] != "resnet20"}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=p.stem, marks=[] if p in QUICK else pytest.mark.slow) for p in RUNNABLE],
)
@pytest.mark.filterwarnings("ignore:clients .* hold only one class:UserWarning")  # tiny files, allowed here
@pytest.mark.filterwarnings(
    "ignore:data.batch_size = .* exceeds every client's data:UserWarning"
)  # tiny files
def test_config_runs_a_few_steps_on_tiny_files(path, tmp_path):
    fields, options = load_config(path)
    make_tiny(fields["dataset"], tmp_path / "data", fields)
    smoke = dict(rounds=1, local_steps=2, stages=1, batch_size=2, eval_every=1, device="cpu", engine="vmap",
                 allow_missing_class=True, data_dir=str(tmp_path / "data"))  # fmt: skip
    if fields["model"].startswith("densenet"):  # DenseNet-121 itself is checked in test_models_zoo.py
        smoke["model"] = "linear"
    if "positives_per_batch" in options:  # FeDXL's B1 positives + B2 negatives, shrunk alike
        smoke["batch_size"], options["positives_per_batch"] = 4, 2
    if fields.get("init_from"):  # ImageNet weights or stage 1 of another config: the smoke model's own
        fresh = {**fields, **smoke, "init_from": None, "reset_head": False, "pretrain": None}  # a fresh model
        smoke["init_from"] = _weights_for(fresh, tmp_path)
    if "pretrain" in fields:
        smoke["pretrain"] = {
            **fields["pretrain"],
            "rounds": 1,
            "local_steps": 2,
            "stages": 1,
            "eval_every": 1,
        }
    result = run_experiment(RunConfig(**{**fields, **smoke}, options=options), tmp_path / "run")
    if "pretrain" in fields:
        assert result.summary["init"]["pretrain"]["status"] == "completed"
        assert result.history[0]["round"] == 0  # the AUC stage's first row: the pretrained model
    final = result.summary["final"]
    assert result.summary["status"] == "completed" and result.summary["num_clients"] == fields["clients"]
    if fields["dataset"] == "chestxray_ih":
        assert len(final["test_auroc_per_label"]) == 5
    else:
        assert (
            final["test_auroc"] is not None
            and 0.0 <= final["test_auroc"] <= 1.0
            and not math.isnan(final["test_auroc"])
        )
