"""What defines a run (:class:`RunConfig`) and its optional first stage, without importing torch.

The bottom of the run layer: pure data, so that the command line can show its
defaults and reject bad arguments in a fraction of a second; default step sizes
and windows come from the catalogue (:mod:`fedxrisk.catalog`), which is the live
algorithm registry once that is loaded. :func:`pretrain_config` derives a two-stage run's first
stage (``[pretrain]``, see :mod:`fedxrisk.run.recipes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedxrisk.catalog import algorithm  # registry facts without torch
from fedxrisk.engines.launch import DEFAULT_TIMEOUT  # the engine owns it; torch-free
from fedxrisk.errors import ConfigError  # noqa: F401  (re-exported)

DEFAULT_LOCAL_STEPS = 8


@dataclass
class RunConfig:
    """Everything that defines a run. ``options`` holds the algorithm's hyperparameters."""

    algorithm: str = "codasca"
    dataset: str = "digits"
    clients: int = 8
    imratio: float | None = 0.1
    test_imratio: float | None = None  # None: the test set's own prevalence
    partition: str = "class"
    dirichlet_alpha: float = 0.5
    positive_classes: list[int | str] | None = None  # class ids or names
    model: str = "mlp"
    rounds: int = 100
    local_steps: int | None = None  # None: the algorithm's fixed window, else 8
    batch_size: int = 32
    lr: float | None = None  # None: the algorithm's default_lr
    stages: int = 3
    lr_decay: float = 3.0
    window_growth: float = 1.0
    seed: int = 0
    engine: str = "vmap"
    device: str = "cpu"
    eval_every: int = 5
    buffer_policy: str = "average"
    pos_ratio_mode: str = "global"
    allow_missing_class: bool = False
    feature_shift: bool = False  # FeDXL's per-client Gaussian feature shift (data/shift.py)
    data_dir: str | None = None  # folder read by file datasets (cifar10, chexpert, …)
    num_samples: int | None = None  # size of a generated dataset (mnist1d, synthetic); None: its default
    positives_per_batch: int = 0  # > 0: class-aware batches for any algorithm (fedxrisk.classaware)
    stream: bool | str = "auto"  # file datasets: decode from disk while training (data/stream.py)
    workers: int | None = None  # decoding worker processes when streaming; None: half the cores
    memory_budget: int | str | None = None  # "auto" streams above it, e.g. "4GB"; None: ¼ of RAM
    image_size: int | None = None  # image datasets: resize to S×S; None: the reader's default (32 or 224)
    normalize: str | dict | None = (
        None  # images: "none", "imagenet" or {mean = [...], std = [...]} per channel
    )
    augment: str = "none"  # training images: "none", "flip" or "crop_flip" (data/augment.py)
    eval_batch_size: int | None = None  # samples per evaluation forward pass; None: from memory_budget
    on_bad_file: str = "error"  # an undecodable file met while streaming: "error" or "skip"
    cache: bool | str = (
        False  # streamed images: decode once into a file; true: the user cache folder, or a path
    )
    clients_per_rank: int | str = 1  # distributed engine: clients held by each rank, or "auto"
    dist_timeout: float = DEFAULT_TIMEOUT  # distributed engine: seconds before a collective fails
    checkpoint_every: int = 10  # rounds between checkpoints; 0: none
    validation: float | str = 0.0  # per-client validation: a fraction, "official" or "auto"; 0: none
    selection: str = "last"  # model.pt: "last" (the final model) or "best" (best validation evaluation)
    monitor: str | None = None  # the val_* column selection and early stopping follow; None: the algorithm's
    early_stopping: int = 0  # stop after this many evaluations without improvement; 0: off
    tensorboard: bool = True  # write TensorBoard events when tensorboard is installed
    init_from: str | None = None  # start from a run folder's model.pt or a state dict file (run/weights.py)
    reset_head: bool = False  # re-initialise the classifier head after loading (FDAM protocol)
    pretrain: dict[str, Any] | None = None  # a first stage's settings (run/recipes.py); None: one stage
    privacy: dict[str, Any] | None = None  # [privacy]: differential privacy (run/privacy.py); None: off
    server: dict[str, Any] | None = None  # [server]: optimizer on the mean of w (engines/server_opt.py)
    options: dict[str, Any] = field(default_factory=dict)

    def resolved_local_steps(self) -> int:
        fixed = (algorithm(self.algorithm) or {}).get("window")
        return self.local_steps if self.local_steps is not None else (fixed or DEFAULT_LOCAL_STEPS)

    def resolved_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        return (algorithm(self.algorithm) or {}).get("default_lr", 0.1)

    def resolved_monitor(self) -> str:
        """The ``val_*`` column selection and early stopping follow: ``monitor``, else the algorithm's."""
        if self.monitor is not None:
            return self.monitor
        return (algorithm(self.algorithm) or {}).get("monitor", "val_auroc")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["local_steps"] = self.resolved_local_steps()
        out["lr"] = self.resolved_lr()
        for key in ("privacy", "server"):  # summaries of runs without them stay as they were
            if out[key] is None:
                del out[key]
        return out


PRETRAIN_ALGORITHM = "localsgdm"  # cross-entropy FedAvg with local momentum
CENTRALIZED = "centralized"  # PRETRAIN_ALGORITHM on one client holding all training data
STAGE_KEYS = (
    "algorithm", "rounds", "lr", "local_steps", "batch_size", "stages", "lr_decay", "window_growth",
    "eval_every", "checkpoint_every", "reset_head",
)  # fmt: skip
INHERITED = ("rounds", "batch_size", "stages", "lr_decay", "window_growth", "eval_every", "checkpoint_every")


def stage_algorithm(name: str) -> str:
    """The registry key a ``pretrain.algorithm`` value trains with."""
    return PRETRAIN_ALGORITHM if name == CENTRALIZED else name


def check_stage_algorithm(name: Any) -> None:
    """``pretrain.algorithm`` is ``centralized`` or a registered algorithm."""
    from fedxrisk.catalog import table

    if name != CENTRALIZED and algorithm(name) is None:
        raise ConfigError(
            f"pretrain.algorithm: unknown algorithm {name!r}; choose {CENTRALIZED!r} or one of {sorted(table('algorithms'))}"
        )


def pretrain_config(cfg: RunConfig) -> RunConfig:
    """The first stage's RunConfig: ``cfg`` with the ``[pretrain]`` settings applied."""
    if cfg.pretrain is None:
        raise ValueError("this config has no [pretrain] section")
    p = dict(cfg.pretrain)
    name = p.pop("algorithm", PRETRAIN_ALGORITHM)
    stage = {k: p.pop(k) for k in STAGE_KEYS if k in p}
    changes: dict[str, Any] = {k: stage[k] for k in INHERITED if k in stage}
    changes |= {
        "algorithm": stage_algorithm(name),
        "lr": stage.get("lr"),
        "local_steps": stage.get("local_steps"),
        "options": p,  # what is left: the pretrain algorithm's hyperparameters
        "reset_head": stage.get("reset_head", False),
        "pretrain": None,
    }
    if name == CENTRALIZED:
        changes |= {"clients": 1, "partition": "iid", "clients_per_rank": 1}
    return dataclasses.replace(cfg, **changes)
