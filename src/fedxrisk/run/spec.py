"""What defines a run (:class:`RunConfig`), without importing torch.

The bottom of the run layer and the one schema of a run: every setting is a
:class:`RunConfig` field declared with :func:`~fedxrisk.run.fields.setting`, which
records its default, its config-file section, its help text, its command-line flag
and the values it allows. The config file's sections (:mod:`fedxrisk.run.configfile`),
the flags of ``fedxrisk run`` (:mod:`fedxrisk.cli.flags`) and ``fedxrisk check`` are
read from these fields (:func:`settings`). Default step sizes and windows come from
the catalogue (:mod:`fedxrisk.catalog`), which is the live algorithm registry once
that is loaded. A two-stage run's first stage: :mod:`fedxrisk.run.stage`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import MISSING, dataclass
from typing import Any, NamedTuple

from fedxrisk.catalog import algorithm  # registry facts without torch
from fedxrisk.engines.launch import DEFAULT_TIMEOUT  # the engine owns it; torch-free
from fedxrisk.errors import ConfigError  # noqa: F401  (re-exported)
from fedxrisk.run.fields import COUNT, PERSONAL, PERSONAL_MONITORS, POSITIVE, SELECTIONS, Allowed, setting

DEFAULT_LOCAL_STEPS = 8
# the config file's tables, in the order a config file lists them; RunConfig's fields follow it
SECTION_ORDER = ("experiment", "data", "model", "algorithm", "engine")
# the partial-participation settings at their defaults (every client, every round) are left out of
# summaries and fingerprints, so runs without them stay as they were
PARTICIPATION_DEFAULTS = (
    ("clients_per_round", None),
    ("participation", "uniform"),
    ("participation_seed", None),
)


@dataclass
class RunConfig:
    """Everything that defines a run, one field per setting (see :func:`setting`); ``options`` holds
    the algorithm's hyperparameters, ``pretrain`` and ``privacy`` their own tables."""

    # [experiment]
    seed: int = setting(
        0,
        section="experiment",
        help="seed of the data split, model and sampling",
        flag="--seed",
        allowed=Allowed(at_least=0),
    )
    rounds: int = setting(
        100, section="experiment", help="communication rounds", flag="--rounds", allowed=COUNT
    )
    eval_every: int = setting(
        5, section="experiment", help="rounds between evaluations", flag="--eval-every", allowed=COUNT
    )
    checkpoint_every: int = setting(
        10,
        section="experiment",
        help="rounds between checkpoints (0: none)",
        flag="--checkpoint-every",
        allowed=Allowed(at_least=0, note=" (0: no checkpoints)"),
    )
    tensorboard: bool = setting(True, section="experiment", help="write TensorBoard events when installed")
    selection: str = setting(
        "last",
        section="experiment",
        help='model.pt: "last" (the final model) or "best" (best validation evaluation)',
        allowed=Allowed(choices=SELECTIONS),
    )
    monitor: str | None = setting(
        None,
        section="experiment",
        help="the val_* column selection and early stopping follow; none: the algorithm's",
    )
    personal_monitor: str = setting(
        "mean",
        section="experiment",
        help="a personalized run chooses on its sites' own models: mean | worst | weighted (by validation "
        "rows) of their validation values; docs/personalization.md",
        allowed=Allowed(choices=PERSONAL_MONITORS),
    )
    early_stopping: int = setting(
        0,
        section="experiment",
        help="stop after this many evaluations without improvement (0: off)",
        allowed=Allowed(at_least=0, note=" (0: off)"),
    )
    # [data]
    dataset: str = setting(
        "digits",
        section="data",
        help="see `fedxrisk list`",
        flag="--dataset",
        allowed=Allowed(choices="datasets"),
    )
    data_dir: str | None = setting(
        None, section="data", help="folder of a file dataset (see docs/data.md)", flag="--data-dir"
    )
    imratio: float | None = setting(
        0.1, section="data", flag="--imratio",
        help="positive ratio kept in training data; 'none' keeps the data's own (the default for any dataset "
        "but the resampled benchmarks: synthetic, digits, breast_cancer, mnist1d, mnist, fashionmnist, cifar*, stl10)",
        allowed=Allowed(above=0, below=1, finite=True),
    )  # fmt: skip
    partition: str = setting(
        "class",
        section="data",
        help="see `fedxrisk list`",
        flag="--partition",
        allowed=Allowed(choices="partitions"),
    )
    clients: int = setting(8, section="data", help="clients K", flag="--clients", short="-K", allowed=COUNT)
    dirichlet_alpha: float = setting(
        0.5,
        section="data",
        help="concentration of the dirichlet partition",
        flag="--dirichlet-alpha",
        allowed=POSITIVE,
    )
    positive_classes: list[int | str] | None = setting(
        None, section="data", help="class ids or names of the positive class; none: the upper half"
    )
    sources: list[str] | None = setting(
        None,
        section="data",
        help="train on these sites only (names as the reader gives them, e.g. "
        '["cleveland"]: a local-only baseline); the test set stays whole; none: every site',
    )
    test_imratio: float | None = setting(
        None,
        section="data",
        help="positive ratio of the test set; none: the test set's own prevalence",
        allowed=Allowed(above=0, below=1, note=', or be "none"'),
    )
    clients_per_round: int | float | None = setting(
        None, section="data", flag="--clients-per-round",
        help="clients taking part in each round: a count m (an integer) or a fraction of K (a number "
        "in (0, 1]); none: every client (docs/participation.md)",
    )  # fmt: skip
    participation: str = setting(
        "uniform",
        section="data",
        help='how a round\'s clients are drawn: "uniform" or "weighted" by shard size',
    )
    participation_seed: int | None = setting(
        None, section="data", help="seed of the clients drawn each round; none: the run seed"
    )
    batch_size: int = setting(
        32, section="data", help="samples per local step", flag="--batch-size", allowed=COUNT
    )
    allow_missing_class: bool = setting(
        False, section="data", help="train even if a client lacks a class", flag="--allow-missing-class"
    )
    feature_shift: bool = setting(
        False, section="data", flag="--feature-shift",
        help="FeDXL heterogeneity: per-client Gaussian feature shift (data/shift.py)",
    )  # fmt: skip
    num_samples: int | None = setting(
        None, section="data", help="size of a generated dataset (mnist1d, synthetic); none: its default"
    )
    positives_per_batch: int = setting(
        0, section="data", help="> 0: class-aware batches with this many positives, for any algorithm"
    )
    stream: bool | str = setting(
        "auto", section="data", help="file datasets: decode from disk while training (true, false, auto)"
    )
    workers: int | None = setting(
        None,
        section="data",
        help="decoding worker processes when streaming; none: half the cores",
    )
    memory_budget: int | str | None = setting(
        None, section="data", help='"auto" streams above it, e.g. "4GB"; none: a quarter of the RAM'
    )
    eval_batch_size: int | None = setting(
        None, section="data", help="samples per evaluation forward pass; none: from memory_budget"
    )
    on_missing: str = setting(
        "error",
        section="data",
        help='a tabular CSV\'s missing cells: "error", "drop_rows", "drop_columns" '
        'or "impute" (each site its own training mean); docs/data.md',
    )
    on_bad_file: str = setting(
        "error",
        section="data",
        help='an undecodable file met while streaming: "error" or "skip"',
    )
    validation: float | str = setting(
        0.0, section="data", help='per-client validation: a fraction, "official" or "auto"; 0: none'
    )
    image_size: int | None = setting(
        None,
        section="data",
        help="image datasets: resize to S×S; none: the reader's default (32 or 224)",
        allowed=Allowed(at_least=1, at_most=4096),
    )
    normalize: str | dict | None = setting(
        None, section="data", help='images: "none", "imagenet" or {mean = [...], std = [...]} per channel'
    )
    augment: str = setting(
        "none", section="data", help='training images: "none", "flip" or "crop_flip" (data/augment.py)'
    )
    cache: bool | str = setting(
        False,
        section="data",
        help="streamed images: decode once into a file; true: the user cache, or a path",
    )
    # [model]
    model: str = setting(
        "mlp", section="model", help="see `fedxrisk list`", flag="--model", allowed=Allowed(choices="models")
    )
    buffer_policy: str = setting(
        "average",
        section="model",
        help="BatchNorm statistics: average | local",
        flag="--buffer-policy",
        allowed=Allowed(choices="buffer_policies"),
    )
    personal: str = setting(
        "none", section="model", flag="--personal",
        help="entries kept per site: none, bn (FedBN) or head (FedPer); docs/personalization.md",
        allowed=Allowed(choices=PERSONAL),
    )  # fmt: skip
    init_from: str | None = setting(
        None, section="model", flag="--init-from",
        help="start from a run folder's model.pt or a PyTorch state dict (two-stage: the first stage)",
    )  # fmt: skip
    reset_head: bool = setting(
        False,
        section="model",
        help="re-initialise the classifier head after --init-from",
        flag="--reset-head",
    )
    # [algorithm]
    algorithm: str = setting(
        "codasca",
        section="algorithm",
        help="see `fedxrisk list`",
        flag="--algorithm",
        short="-a",
        allowed=Allowed(choices="algorithms"),
    )
    lr: float | None = setting(
        None,
        section="algorithm",
        help="step size (default: the algorithm's, see `fedxrisk list`)",
        flag="--lr",
        allowed=POSITIVE,
    )
    local_steps: int | None = setting(
        None, section="algorithm", flag="--local-steps", short="-I",
        help=f"window I; none: the algorithm's fixed window, else {DEFAULT_LOCAL_STEPS}",
    )  # fmt: skip
    stages: int = setting(
        3, section="algorithm", help="lr ÷ lr-decay per stage", flag="--stages", allowed=COUNT
    )
    finetune_steps: int = setting(
        0, section="algorithm", flag="--finetune-steps",
        help="local steps per site after training, each site keeping its model (0: none)",
        allowed=Allowed(at_least=0, note=" (0: no fine-tuning)"),
    )  # fmt: skip
    lr_decay: float = setting(
        3.0,
        section="algorithm",
        help="step size divisor per stage",
        flag="--lr-decay",
        allowed=Allowed(finite=True),
    )
    window_growth: float = setting(
        1.0, section="algorithm", help="window multiplier per stage", allowed=Allowed(finite=True)
    )
    pos_ratio_mode: str = setting(
        "global",
        section="algorithm",
        help="global | local | batch",
        flag="--pos-ratio",
        allowed=Allowed(choices="pos_ratio_modes"),
    )
    # [engine]
    engine: str = setting(
        "vmap",
        section="engine",
        help="loop | vmap | compile | auto | distributed",
        flag="--engine",
        allowed=Allowed(choices="engines"),
    )
    device: str = setting(
        "cpu", section="engine", help="torch device: cpu, cuda, cuda:N, mps", flag="--device"
    )
    clients_per_rank: int | str = setting(
        1, section="engine", flag="--clients-per-rank",
        help="distributed: clients per rank (WORLD_SIZE × this = --clients), or 'auto'",
    )  # fmt: skip
    dist_timeout: float = setting(
        DEFAULT_TIMEOUT, section="engine", help="distributed: seconds before a collective fails",
        flag="--dist-timeout", allowed=Allowed(finite=True),
    )  # fmt: skip
    # tables of their own
    pretrain: dict[str, Any] | None = setting(
        None, section=None, help="[pretrain]: a first stage's settings (run/recipes.py); none: one stage"
    )
    server: dict[str, Any] | None = setting(
        None, section=None, help="[server]: optimizer on the mean of w (engines/server_opt.py); none: off"
    )
    privacy: dict[str, Any] | None = setting(
        None, section=None, help="[privacy]: differential privacy (run/privacy.py); none: off"
    )
    options: dict[str, Any] = setting(
        section=None, factory=dict, help="[algorithm]: the algorithm's hyperparameters (`fedxrisk list`)"
    )

    def resolved_local_steps(self) -> int:
        fixed = (algorithm(self.algorithm) or {}).get("window")
        return self.local_steps if self.local_steps is not None else (fixed or DEFAULT_LOCAL_STEPS)

    def resolved_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        return (algorithm(self.algorithm) or {}).get("default_lr", 0.1)

    def resolved_positives(self) -> int:
        """P of class-aware batches (0: plain batches): ``data.positives_per_batch``, else the
        algorithm's option, else its own default (FeDXL's B1 = 16) — halved to ``batch_size // 2`` when
        it would leave a batch no negatives, so that the default runs at any batch size ≥ 2."""
        if self.positives_per_batch or "positives_per_batch" in self.options:
            return self.positives_per_batch or self.options["positives_per_batch"]
        own = (algorithm(self.algorithm) or {}).get("hyperparameters", {}).get("positives_per_batch", 0)
        return own if own < self.batch_size or not own else max(1, self.batch_size // 2)

    def resolved_monitor(self) -> str:
        """The column selection, early stopping and ``tune`` follow: ``monitor``, else the algorithm's
        ``val_*``; in a run whose sites train their own models (``model.personal``, Ditto; not the
        distributed engine, not under DP) ``site_val_<metric>_<personal_monitor>``: the sites' own
        models on their own validation rows (engines/personal.py ``site_validation``). Under DP
        selection stays on the released global validation, so model.pt keeps its ε."""
        if self.monitor is not None:
            return self.monitor
        base = (algorithm(self.algorithm) or {}).get("monitor", "val_auroc")
        own = self.sites_train_own_models() and self.privacy is None
        return f"site_{base}_{self.personal_monitor}" if own else base

    def sites_train_own_models(self) -> bool:
        """The sites' models differ during training and are all scored in this process."""
        ditto = bool((algorithm(self.algorithm) or {}).get("personal_model"))
        return (self.personal != "none" or ditto) and self.engine != "distributed"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["local_steps"] = self.resolved_local_steps()
        out["lr"] = self.resolved_lr()
        for key in ("privacy", "server"):  # summaries of runs without them stay as they were
            if out[key] is None:
                del out[key]
        defaults = (
            ("personal", "none"),
            ("finetune_steps", 0),
            ("personal_monitor", "mean"),
            *PARTICIPATION_DEFAULTS,
        )
        for key, default in defaults:  # likewise without personalization or partial participation
            if out[key] == default:
                del out[key]
        return out


class Setting(NamedTuple):
    """One run setting as :func:`setting` declared it."""

    name: str
    default: Any
    hint: Any  # the field's type hint
    section: str | None  # its config-file table; None: a table of its own (pretrain, privacy, options)
    help: str
    flag: str | None  # `fedxrisk run`'s flag; None: --set only
    short: str | None
    allowed: Allowed | None  # the values it allows beyond its type (run/rules.py declared)


def settings() -> dict[str, Setting]:
    """Every run setting, in field order: the schema the config file, the flags and the checks read."""
    return dict(_settings())


@functools.cache
def _settings() -> dict[str, Setting]:
    hints = typing.get_type_hints(RunConfig)
    out = {}
    for f in dataclasses.fields(RunConfig):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        m = f.metadata
        out[f.name] = Setting(
            f.name, default, hints[f.name], m["section"], m["help"], m["flag"], m["short"], m["allowed"]
        )
    return out
