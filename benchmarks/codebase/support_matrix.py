"""The support matrix: every registered algorithm × [server] × model.personal × privacy level ×
engine × selection, each cell refused by the run's own check in one line, or accepted.

    python benchmarks/codebase/support_matrix.py            # write docs/support.md
    python benchmarks/codebase/support_matrix.py --check    # exit 1 if docs/support.md differs from it

The axes are declared here once (:data:`AXES`: a value's name → the settings it sets); the algorithm
axis is the registry (:data:`fedxrisk.algorithms.ALGORITHMS`) and the engine axis the engine
registry plus the Flower deployment, so a new algorithm or engine joins the matrix by itself.
A cell's verdict is what ``fedxrisk check`` says (:func:`fedxrisk.run.checks.check`, with the
ranks of a distributed launch planned as ``--nproc-per-node`` plans them); for a Flower cell,
what Flower's run config says (:meth:`fedxrisk.flower.config.FlowerConfig.validate`: the same
check, then what a deployment does not honour). ``tests/test_support_matrix.py`` runs a
covering design of the accepted cells and checks that each setting changes what it should; it
also checks that docs/support.md equals :func:`render`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.*` imports, however this file was loaded
from benchmarks.common.data import survival_dir  # noqa: E402

DOC = ROOT / "docs" / "support.md"
FLOWER = "flower"  # the Flower deployment: a column of the engine axis, checked by its run config
NOT_ENGINES = {"auto": "picks one of the others (vmap, else loop)"}  # registry entries that are choices


def _bn_model() -> str:
    """The first registered model with BatchNorm layers (personal = "bn" needs one)."""
    from fedxrisk.run.combos import MODEL_LAYERS

    return next(m for m, layers in MODEL_LAYERS.items() if layers["bn"])


def engines() -> list[str]:
    from fedxrisk.catalog import table

    return [e for e in table("engines") if e not in NOT_ENGINES] + [FLOWER]


def algorithms() -> list[str]:
    from fedxrisk.catalog import table

    return list(table("algorithms"))


# client level, selection = best: two sites' validation rows carry signal under this release
CLIENT_VALIDATION = {"validation_noise_multiplier": 0.4, "validation_bins": 3}
PRIVACY = {"clip": 0.01, "noise_multiplier": 1.0}  # σC/K: noise that leaves a tiny MLP trainable


@functools.cache
def axes() -> dict[str, dict[str, dict[str, Any]]]:
    """Every axis but the algorithm: value name → the RunConfig fields it sets."""
    return {
        "server": {"none": {}, "adam": {"server": {"optimizer": "adam", "lr": 0.1}}},
        "personal": {
            "none": {},
            "head": {"personal": "head"},
            "bn": {"personal": "bn", "model": _bn_model()},
            "finetune": {"finetune_steps": 2},
        },
        "privacy": {
            "none": {},
            "instance": {"privacy": {"level": "instance", **PRIVACY}},
            "client": {"privacy": {"level": "client", **PRIVACY}},
        },
        "engine": {e: {"engine": "loop" if e == FLOWER else e} for e in engines()},
        "selection": {"last": {}, "best": {"selection": "best", "validation": 0.25, "eval_every": 1}},
    }


DEFAULT = {"server": "none", "personal": "none", "privacy": "none", "engine": "loop", "selection": "last"}


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    algorithm: str
    server: str = "none"
    personal: str = "none"
    privacy: str = "none"
    engine: str = "loop"
    selection: str = "last"

    def values(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in DEFAULT}


def base(algorithm: str) -> dict[str, Any]:
    """A tiny run of ``algorithm``: two clients, two rounds of two stages, one local step (or the
    algorithm's fixed window), batches of 8 (4 positives for a class-aware algorithm); digits for a
    binary algorithm, :func:`survival_dir`'s table for a survival one."""
    from fedxrisk.catalog import table

    info = table("algorithms")[algorithm]
    data = {"dataset": "digits", "imratio": 0.3}
    if info["task"] == "survival":
        data = {"dataset": "survival", "data_dir": survival_dir(), "imratio": None}
    return dict(
        algorithm=algorithm, **data, partition="iid", clients=2, rounds=2,
        stages=2, local_steps=info["window"] or 1, batch_size=8, eval_every=2, checkpoint_every=0,
        tensorboard=False, model="mlp", lr=0.05,
        positives_per_batch=4 if info["hyperparameters"].get("positives_per_batch") else 0,
    )  # fmt: skip


def config(cell: Cell) -> Any:
    """The cell's :class:`~fedxrisk.run.spec.RunConfig`."""
    from fedxrisk.run.spec import RunConfig

    fields = base(cell.algorithm)
    for axis, value in cell.values().items():
        fields |= axes()[axis][value]
    if cell.selection == "best" and cell.privacy == "client":  # z = 10 would drown two sites' validation
        fields["privacy"] = {**fields["privacy"], **CLIENT_VALIDATION}
    return RunConfig(**fields)


def verdict(cell: Cell) -> str | None:
    """None: the cell is accepted; else the refusal's one line (the first error)."""
    from fedxrisk.errors import ConfigError
    from fedxrisk.run.checks import check

    cfg = config(cell)
    if cell.engine == FLOWER:
        from fedxrisk.flower.config import FlowerConfig, to_flat

        try:
            FlowerConfig.from_run_config(to_flat(cfg))
        except ConfigError as e:
            return str(e)
        return None
    from fedxrisk.engines.launch import planned_world

    with planned_world(cfg.clients) if cell.engine == "distributed" else nullcontext():
        errors = check(cfg, thorough=True)
    return str(errors[0]) if errors else None


def cells() -> Iterator[Cell]:
    """The full product (the docs table and the test read its verdicts)."""
    names = list(DEFAULT)
    for algorithm in algorithms():
        for combo in itertools.product(*(axes()[n] for n in names)):
            yield Cell(algorithm, **dict(zip(names, combo)))


@functools.cache
def verdicts() -> dict[Cell, str | None]:
    """Every cell's verdict (a few seconds: the check of every cell of the full product)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {cell: verdict(cell) for cell in cells()}


def changed(cell: Cell) -> dict[str, str]:
    """The cell's values that differ from :data:`DEFAULT`."""
    return {k: v for k, v in cell.values().items() if v != DEFAULT[k]}


def minimal_refusals() -> dict[tuple[tuple[str, str], ...], dict[str, list[str]]]:
    """The refused combinations every part of which is accepted: settings → reason → algorithms.
    Every refused cell contains one of them (a cell with a refused part is refused too)."""
    found: dict[tuple[tuple[str, str], ...], dict[str, list[str]]] = {}
    table = verdicts()
    for cell, reason in table.items():
        diff = changed(cell)
        if reason is None or any(
            table[dataclasses.replace(cell, **{k: DEFAULT[k]})] is not None for k in diff
        ):
            continue
        key = tuple(diff.items())
        found.setdefault(key, {}).setdefault(_generic(reason, cell.algorithm), []).append(cell.algorithm)
    return found


def _generic(reason: str, algorithm: str) -> str:
    """A reason with the algorithm's name as ALG, so that algorithms refused alike share a row."""
    return reason.replace(f" {algorithm} ", " ALG ").replace(f"({algorithm})", "(ALG)")


RUN_ENGINES = ("loop", "vmap", FLOWER)  # run in one process: the design's runs (compile, distributed: slow)


def cost(cell: Cell) -> float:
    """Rough seconds of the cell's runs in the test: one run (twice on Flower, three times with the
    BatchNorm model, plus the privacy accountant), and a twin run to compare with for a server
    optimizer and for privacy (both: three runs)."""
    seconds = 0.2 * (2 if cell.engine == FLOWER else 1) * (3 if cell.personal == "bn" else 1)
    seconds += {"none": 0.0, "instance": 0.8, "client": 0.3}[cell.privacy]
    seconds += 1.0 if cell.privacy == "client" and cell.selection == "best" else 0.0
    return (1 + (cell.server != "none") + (cell.privacy != "none")) * seconds


def requirements(cell: Cell) -> frozenset[tuple]:
    """What running ``cell`` covers: (algorithm, axis, non-default value) and each pair of values
    of two axes."""
    values = list(cell.values().items())
    own = {(cell.algorithm, axis, value) for axis, value in values if value != DEFAULT[axis]}
    pairs = {(a, b) for a, b in itertools.combinations(values, 2)}
    return frozenset(own | pairs)


@functools.cache
def design() -> tuple[Cell, ...]:
    """The cells the test runs: a greedy covering design (as AETG) over the accepted cells on
    :data:`RUN_ENGINES`: every algorithm with each value of each axis (where accepted), and every
    pair of values of two axes (where some algorithm accepts it), preferring cheap cells."""
    candidates = sorted(
        (c for c, v in verdicts().items() if v is None and c.engine in RUN_ENGINES),
        key=lambda c: (cost(c), c),
    )
    covers = {c: requirements(c) for c in candidates}
    todo = set().union(*covers.values())
    chosen = []
    while todo:
        best = max(candidates, key=lambda c: (len(covers[c] & todo) / cost(c) ** 0.5, -cost(c)))
        chosen.append(best)
        todo -= covers[best]
    for cell in sorted(chosen, key=cost, reverse=True):  # then drop a cell the others cover
        rest = [c for c in chosen if c != cell]
        if covers[cell] <= set().union(*(covers[c] for c in rest)):
            chosen = rest
    return tuple(sorted(chosen))


COLUMNS = [(axis, value) for axis, values in axes().items() for value in values if value != DEFAULT[axis]]


def _setting(axis: str, value: str) -> str:
    """How a user writes the axis value (the settings its declaration sets)."""
    shown = {k: v for k, v in axes()[axis][value].items() if k != "engine" or value != FLOWER}
    if axis == "engine" and value == FLOWER:
        return "the Flower app"
    if axis == "privacy" and value != "none":
        return f'privacy.level = "{value}", clip = {PRIVACY["clip"]}, noise_multiplier = {PRIVACY["noise_multiplier"]}'
    return ", ".join(f"{k} = {_toml(v)}" for k, v in shown.items())


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return (
        f'"{value}"'
        if isinstance(value, str)
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
    )


def render() -> str:
    """docs/support.md: the per-algorithm table (each value alone) and every refused combination."""
    table, notes = verdicts(), {}
    lines = [
        "# What runs with what: the support matrix",
        "",
        "<!-- generated by `python benchmarks/codebase/support_matrix.py` from its declarations and the run's checks;"
        " tests/test_support_matrix.py fails when this page differs -->",
        "",
        "Every registered algorithm × `[server]` × `model.personal` × privacy level × engine × selection:"
        f" {len(table):,} combinations, each checked as `fedxrisk check` checks it (on Flower: the app's run"
        " config check). A combination is either refused in one line before anything runs, or it runs:"
        " `tests/test_support_matrix.py` runs a covering design of"
        f" {len(design())} accepted combinations (every algorithm with each value, every pair of values;"
        " loop, vmap and Flower in process) and checks that each setting changes what it should.",
        "",
        "## Each setting alone",
        "",
        "Against a run of the algorithm with the defaults (no `[server]`, personal = none, no privacy,"
        " engine = loop, selection = last). ✓: accepted; a number: refused, the reason below.",
        "",
    ]
    header = ["algorithm", *(f"{axis}: {value}" for axis, value in COLUMNS)]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for algorithm in algorithms():
        row = [f"`{algorithm}`"]
        for axis, value in COLUMNS:
            reason = table[Cell(algorithm, **{axis: value})]
            if reason is None:
                row.append("✓")
            else:
                key = _generic(reason, algorithm)
                row.append(str(notes.setdefault(key, len(notes) + 1)))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", *(f"{n}. {reason.replace('ALG', 'the algorithm')}" for reason, n in notes.items()), ""]
    lines += [
        "## Refused combinations",
        "",
        "Combinations refused although each of their settings is accepted alone (a combination that"
        " contains one of these is refused too). Every other combination of accepted settings is accepted.",
        "",
        "| settings | algorithms | `fedxrisk check` says |",
        "|---|---|---|",
    ]
    for settings, reasons in sorted(minimal_refusals().items(), key=lambda kv: (len(kv[0]), kv[0])):
        if len(settings) < 2:
            continue
        for reason, names in reasons.items():
            who = "every other" if len(names) > len(algorithms()) / 2 else ", ".join(f"`{a}`" for a in names)
            if who == "every other":
                others = [a for a in algorithms() if a not in names]
                who = (
                    "all"
                    if not others
                    else "all but " + ", ".join(f"`{a}`" for a in others) + " (refused alone)"
                )
            what = " + ".join(_setting(axis, value) for axis, value in settings)
            lines.append(f"| {what} | {who} | {reason.replace('|', '/')} |")
    lines += [
        "",
        "## The axes",
        "",
        *(
            f"- **{axis}**: " + "; ".join(f"`{v}`: {_setting(axis, v) or 'default'}" for v in values)
            for axis, values in axes().items()
        ),  # fmt: skip
        f"- **algorithm**: the registry ({len(algorithms())}); Ditto is the algorithm `ditto`.",
        "- not an axis value: " + "; ".join(f"engine `{e}` {why}" for e, why in NOT_ENGINES.items()) + ".",
        "",
        "Each combination starts from a tiny run: digits, 2 clients, 2 rounds of 2 stages, one local step"
        " (or the algorithm's fixed window), batches of 8 (4 positives for a class-aware algorithm), the mlp."
        " Client-level privacy with selection = best also sets "
        + ", ".join(f"privacy.{k} = {v}" for k, v in CLIENT_VALIDATION.items())
        + ": the default z = 10 would drown two sites' validation rows (refused on loading).",
        "",
        "personal = bn runs on the first registered model with BatchNorm; on a model without it, it is"
        " refused (`model.personal = 'bn': the model 'mlp' has no BatchNorm layer`).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help=f"exit 1 if {DOC.relative_to(ROOT)} differs")
    args = p.parse_args()
    text = render()
    if args.check:
        sys.exit(0 if DOC.is_file() and DOC.read_text() == text else 1)
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
