"""Federated few-shot tasks for MAML (FCSG paper §5.2; ALGORITHMS.md §1.9).

A *class pool* is a list of arrays, one per class, each ``[instances, C, H, W]``.
The training classes are split into disjoint sets, one per client ("tasks are
evenly partitioned into disjoint sets"); a client's task is N classes of its
own set with K support (the inner samples η) and Q query (the outer sample's
data a) instances per class, labels permuted per task.

Two class sources: :func:`digits_fewshot` (bundled, no download: scikit-learn's
8×8 digits, each digit in four rotations = 40 classes; digits 0–6 train,
7–9 test) and :func:`load_omniglot`, a reader for Omniglot's standard layout
``root/images_background/<alphabet>/<character>/*.png`` (train) and
``root/images_evaluation/...`` (test).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedxrisk.data.federated import every_client
from fedxrisk.objectives.conditional import MAMLObjective, check_sample
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, tmap

ClassPool = list[np.ndarray]


def sample_task(
    rng: np.random.Generator, pool: ClassPool, n_way: int, k_shot: int, q_query: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(support x, support y, query x, query y) of one N-way K-shot task from ``pool``."""
    classes = rng.choice(len(pool), n_way, replace=False)
    sx, sy, qx, qy = [], [], [], []
    for label, c in enumerate(classes):
        pick = rng.choice(len(pool[c]), k_shot + q_query, replace=False)
        sx.append(pool[c][pick[:k_shot]])
        qx.append(pool[c][pick[k_shot:]])
        sy += [label] * k_shot
        qy += [label] * q_query
    return np.concatenate(sx), np.array(sy), np.concatenate(qx), np.array(qy)


def _check_pool(pool: ClassPool, n_way: int, k_shot: int, q_query: int, where: str) -> None:
    if len(pool) < n_way:
        raise ValueError(f"{where} has {len(pool)} classes; a {n_way}-way task needs {n_way}")
    small = min(len(c) for c in pool)
    if small < k_shot + q_query:
        raise ValueError(
            f"{where}: a class has {small} instances; need k_shot + q_query = {k_shot + q_query}"
        )


class FewShotTasks:
    """Online source of N-way K-shot tasks, the classes split over clients.

    Batch per client: ``xi = {"x": [b, N·Q, ...], "y": [b, N·Q]}`` (query sets),
    ``eta = {"x": [b, N·K, ...], "y": [b, N·K]}`` (support sets, m = N·K),
    b = ``meta_batch`` tasks per local step.
    """

    def __init__(
        self,
        train_classes: ClassPool,
        num_clients: int,
        n_way: int = 5,
        k_shot: int = 1,
        q_query: int = 15,
        meta_batch: int = 4,
        seed: int = 0,
    ):
        if min(n_way, q_query, meta_batch, num_clients) < 1:
            raise ValueError("n_way, q_query, meta_batch and num_clients must be ≥ 1")
        if k_shot < 1:
            raise ValueError(f"k_shot must be ≥ 1 (m = n_way·k_shot inner samples), got {k_shot}")
        self.n_way, self.k_shot, self.q_query, self.meta_batch = n_way, k_shot, q_query, meta_batch
        order = np.random.default_rng([seed, 5]).permutation(len(train_classes))
        self.pools = [[train_classes[i] for i in part] for part in np.array_split(order, num_clients)]
        for k, pool in enumerate(self.pools):
            _check_pool(pool, n_way, k_shot, q_query, f"client {k}")
        self.rngs = [np.random.default_rng([seed, 3, k]) for k in range(num_clients)]
        self.calls = 0

    @property
    def num_clients(self) -> int:
        return len(self.pools)

    @property
    def shard_sizes(self) -> list[int]:
        return [len(p) for p in self.pools]  # classes per client (tasks are drawn fresh)

    def client_pos_ratio(self, k: int) -> float:
        return 1.0 / self.n_way

    def batch(
        self, positions: np.ndarray, device: torch.device | str = "cpu", rows: torch.Tensor | None = None
    ) -> dict:
        every_client(rows, type(self).__name__)
        per_client = []
        for rng, pool in zip(self.rngs, self.pools):
            tasks = [
                sample_task(rng, pool, self.n_way, self.k_shot, self.q_query) for _ in range(self.meta_batch)
            ]
            per_client.append([np.stack(part) for part in zip(*tasks)])
        sx, sy, qx, qy = (np.stack(part) for part in zip(*per_client))
        k, b, m = sy.shape
        ids = torch.arange(b).expand(k, b) + self.calls * b
        self.calls += 1

        def t(v: np.ndarray, dtype=torch.float32) -> torch.Tensor:
            return torch.as_tensor(v, dtype=dtype, device=device)

        sample = {
            "xi": {"x": t(qx), "y": t(qy, torch.int64)},
            "eta": {"x": t(sx), "y": t(sy, torch.int64)},
            "xi_id": ids.to(device),
            "eta_of": ids.unsqueeze(-1).expand(k, b, m).to(device),
        }
        check_sample(sample, batch_dims=1)
        return sample


def digits_fewshot(rotations: bool = True) -> tuple[ClassPool, ClassPool]:
    """Bundled class pools from scikit-learn's digits: each digit (×4 rotations) is a class;
    digits 0–6 are training classes, 7–9 test classes. Images ``[n, 1, 8, 8]`` in [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = (d.images / 16.0).astype(np.float32)
    train, test = [], []
    for digit in range(10):
        base = images[d.target == digit]
        for r in range(4 if rotations else 1):
            (train if digit < 7 else test).append(
                np.ascontiguousarray(np.rot90(base, r, axes=(1, 2)))[:, None]
            )
    return train, test


def _read_image(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        gray = img.convert("L").resize((size, size), Image.Resampling.LANCZOS)
        return 1.0 - np.asarray(gray, dtype=np.float32) / 255.0  # strokes → 1, background → 0


def _read_split(folder: Path, size: int) -> ClassPool:
    pool = []
    for alphabet in sorted(p for p in folder.iterdir() if p.is_dir()):
        for character in sorted(p for p in alphabet.iterdir() if p.is_dir()):
            files = sorted(character.glob("*.png"))
            if files:
                pool.append(np.stack([_read_image(f, size) for f in files])[:, None])
    if not pool:
        raise ValueError(f"{folder} holds no <alphabet>/<character>/*.png images")
    return pool


def load_omniglot(root: str | Path, image_size: int = 28) -> tuple[ClassPool, ClassPool]:
    """Omniglot's standard layout: ``images_background`` (train) and ``images_evaluation``
    (test), each ``<alphabet>/<character>/*.png``; one class per character, images
    resized to ``image_size`` and inverted so strokes are 1."""
    root = Path(root)
    splits = [root / "images_background", root / "images_evaluation"]
    missing = [str(s) for s in splits if not s.is_dir()]
    if missing:
        raise FileNotFoundError(f"Omniglot folder(s) not found: {missing} (expected the standard layout)")
    return _read_split(splits[0], image_size), _read_split(splits[1], image_size)


def evaluate_fewshot(
    problem: Problem,
    params: Tree,
    pool: ClassPool,
    n_way: int = 5,
    k_shot: int = 1,
    q_query: int = 15,
    num_tasks: int = 100,
    steps: int = 3,
    inner_lr: float = 0.4,
    seed: int = 0,
) -> float:
    """Mean query accuracy on ``num_tasks`` tasks from ``pool`` after ``steps`` adaptation
    steps of size ``inner_lr`` on each task's support set (the paper evaluates with 3)."""
    _check_pool(pool, n_way, k_shot, q_query, "evaluation pool")
    objective = MAMLObjective(inner_lr)
    rng = np.random.default_rng([seed, 11])
    accs = []
    for _ in range(num_tasks):
        sx, sy, qx, qy = (torch.as_tensor(v) for v in sample_task(rng, pool, n_way, k_shot, q_query))
        adapted = tmap(torch.clone, params)
        for _ in range(steps):
            adapted = objective.adapt(problem, adapted, sx, sy)
        with torch.no_grad():
            pred = torch.func.functional_call(problem.model, adapted, (qx,)).argmax(1)
        accs.append(float((pred == qy).float().mean()))
    return float(np.mean(accs))
