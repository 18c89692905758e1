"""The support matrix (issue 39.4): every registered algorithm × ``[server]`` (none / adam) ×
``model.personal`` (none / head / bn / finetune; Ditto is the algorithm ``ditto``, whose site
models are checked in each of its cells) × privacy level (none / instance / client) × engine (the
engine registry but ``auto``, plus Flower) × selection (last / best). The axes are declared once,
in benchmarks/codebase/support_matrix.py, from the registries: a new algorithm or engine joins by itself.

Every cell of the full product is checked as ``fedxrisk check`` checks it (Flower's:
its run config's check): refused in one line naming a setting it sets, or accepted. A refused
cell's minimal combination is refused by ``fedxrisk run`` too, with the same line, before
anything is written.

**Design of the runs.** Running the product would take hours, so the test runs a covering design
of the accepted cells (``support_matrix.design``, a greedy AETG-like choice, asserted here): every
algorithm with each non-default value of each axis at least once (where the check accepts it), and
every pair of values of two axes at least once (where some algorithm accepts the pair), on the
engines that run in one process: loop, vmap and Flower through its in-process transport (the
same site and server handlers a ClientApp and ServerApp run). compile and distributed (torch
compilation, torchrun ranks) are check-only here plus a few slow run cells. Each run is tiny
(digits, 2 clients, 2 rounds of 1 local step, batches of 8) and checks that each setting changes
what it should:

- ``[server]``: the model differs from the same cell without ``[server]`` (under privacy both
  with the same reproducible noise);
- ``personal`` head / bn: the two sites' models differ, and only in their personal entries,
  which differ from the global model's (on Flower the server never receives them);
- ``finetune``: each site's model differs from the global model;
- an algorithm that declares ``personal_model`` (Ditto): the sites' models differ;
- privacy: two runs with secret noise give different models, and ε is reported;
- ``selection = "best"``: ``summary.selected`` is a round of the history with the best
  validation value.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import math
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "support_matrix", ROOT / "benchmarks" / "codebase" / "support_matrix.py"
)
support = importlib.util.module_from_spec(_spec)
sys.modules["support_matrix"] = support
_spec.loader.exec_module(support)
Cell = support.Cell


@dataclass
class Ran:
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    out: Path

    def model(self) -> dict[str, torch.Tensor]:
        return _entries(self.out / "model.pt")

    def sites(self) -> list[dict[str, torch.Tensor]]:
        return [_entries(self.out / f"site_{k}.pt") for k in range(2)]


def _entries(path: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(path, weights_only=False)
    return {**saved["params"], **saved["buffers"]}


def run(cell: Cell, out: Path, noise: int | None = None) -> Ran:
    """Run ``cell`` into ``out``; ``noise``: privacy.reproducible_noise (None: secret noise)."""
    cfg = support.config(cell)
    if noise is not None:
        cfg = replace(cfg, privacy={**cfg.privacy, "reproducible_noise": noise})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if cell.engine != support.FLOWER:
            from fedxrisk.experiment import run_experiment

            result = run_experiment(cfg, out)
            return Ran(result.summary, result.history, out)
        from fedxrisk.flower.config import FlowerConfig, to_flat
        from fedxrisk.flower.coordinator import Coordinator, LocalTransport

        out.mkdir(parents=True)
        rc = to_flat(cfg) | {"test-data": "digits", "out-dir": str(out), "min-nodes": 2}
        nodes = {
            1000 + k: {"dataset": "digits", "partition-id": k, "num-partitions": 2, "site-model": str(out / f"site_{k}.pt")}
            for k in range(2)
        }  # fmt: skip
        summary = Coordinator(
            FlowerConfig.from_run_config(rc), LocalTransport(rc, nodes), poll_interval=0.0
        ).run()
        with open(out / "history.csv") as f:
            history = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
        return Ran(summary, history, out)


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])}


def _apart(a: Ran, b: Ran) -> bool:
    """The two runs' models differ by more than float noise: ``model.pt``, or the final model's
    train loss or test AUROC or C-index (FeDXL2-Cox moves no weight in round 1: its pools fill; with selection = "best" model.pt may be the same early round's)."""
    ma, mb = a.model(), b.model()
    if max((ma[k].double() - mb[k].double()).abs().max().item() for k in ma) > 1e-6:
        return True
    finals = [
        (a.summary["final"].get(k), b.summary["final"].get(k))
        for k in ("train_loss", "test_auroc", "test_cindex")
    ]
    return any(x is not None and y is not None and abs(x - y) > 1e-6 for x, y in finals)


# -- the declarations ----------------------------------------------------------------------------


def test_every_registered_algorithm_and_engine_is_an_axis_value():
    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.catalog import table

    assert sorted(support.algorithms()) == sorted(ALGORITHMS)
    assert set(support.engines()) == set(table("engines")) - set(support.NOT_ENGINES) | {support.FLOWER}
    assert {c.algorithm for c in support.design()} == set(ALGORITHMS)


def test_each_algorithms_tiny_run_is_accepted_on_the_loop_engine():
    """The base of every cell passes the check: a refusal is the setting's, not the base's."""
    assert {a: support.verdicts()[Cell(a)] for a in support.algorithms()} == dict.fromkeys(
        support.algorithms()
    )


def test_every_refusal_is_one_line_naming_a_setting_the_cell_sets():
    words = {"server": ("server",), "personal": ("personal",), "privacy": ("privacy",),
             "engine": ("engine", "compile", "Flower", "distributed"), "selection": ("selection",)}  # fmt: skip
    bad = []
    for cell, reason in support.verdicts().items():
        if reason is None:
            continue
        named = any(w in reason for axis in support.changed(cell) for w in words[axis])
        if "\n" in reason or not named:
            bad.append((cell, reason))
    assert bad == []


def test_each_minimal_refusal_is_what_fedxrisk_run_says_before_writing(tmp_path):
    """One cell per minimal refused combination and reason (not Flower's: its run config's check is
    the refusal): ``run_experiment`` raises the check's line and leaves no folder."""
    from fedxrisk.errors import ConfigError
    from fedxrisk.experiment import run_experiment

    cases = 0
    for settings, reasons in support.minimal_refusals().items():
        if dict(settings).get("engine") in (support.FLOWER, "distributed"):
            continue
        for algorithms in reasons.values():
            cell = Cell(algorithms[0], **dict(settings))
            out = tmp_path / f"run{cases}"
            with pytest.raises(ConfigError) as refused:
                run_experiment(support.config(cell), out)
            assert str(refused.value).split(" (and ")[0] == support.verdicts()[cell]
            assert not out.exists()
            cases += 1
    assert cases >= 10


def test_the_design_covers_every_value_per_algorithm_and_every_pair():
    """What the docstring promises, recomputed from the accepted cells."""
    design = support.design()
    accepted = [c for c, v in support.verdicts().items() if v is None and c.engine in support.RUN_ENGINES]
    assert all(support.verdicts()[c] is None and c.engine in support.RUN_ENGINES for c in design)
    values = lambda cells: {(c.algorithm, a, v) for c in cells for a, v in support.changed(c).items()}  # noqa: E731
    pairs = lambda cells: {p for c in cells for p in itertools.combinations(c.values().items(), 2)}  # noqa: E731
    assert values(accepted) - values(design) == set()
    assert pairs(accepted) - pairs(design) == set()
    assert len(design) < len(accepted) / 10


def test_the_docs_table_is_the_generated_one():
    assert support.DOC.read_text() == support.render(), "run `python benchmarks/codebase/support_matrix.py`"


# -- the runs ------------------------------------------------------------------------------------


def _id(cell: Cell) -> str:
    return "-".join([cell.algorithm, *(f"{k}={v}" for k, v in support.changed(cell).items())])


@pytest.mark.parametrize("cell", support.design(), ids=_id)
def test_an_accepted_cell_runs_and_each_setting_does_what_it_should(cell, tmp_path):
    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.problem import personal_names
    from fedxrisk.run.folder import load_model

    both = cell.server != "none" and cell.privacy != "none"  # reproducible noise: the server's effect
    ran = run(cell, tmp_path / "cell", 7 if both else None)
    assert ran.summary["status"] == "completed", ran.summary.get("error")
    model = ran.model()
    if cell.server != "none":
        plain = run(replace(cell, server="none"), tmp_path / "no_server", 7 if both else None)
        assert _apart(plain, ran), "[server] changed nothing"
    if cell.privacy != "none":
        again = run(cell, tmp_path / "again", 8 if both else None)
        assert _apart(again, ran), "two noise draws gave the same run"
        eps = ran.summary["privacy"]["epsilon"]
        assert math.isfinite(eps) and eps > 0
        assert again.summary["privacy"]["noise"] == (
            "secret" if not both else "reproducible test mode: NOT PRIVATE"
        )
    personalized = hasattr(ALGORITHMS[cell.algorithm], "personal_model")  # Ditto: the site's model is v
    if cell.personal in ("head", "bn"):
        sites = ran.sites()
        kept = personal_names(load_model(ran.out), cell.personal)
        assert kept and _differs(*sites) and (personalized or _differs(*sites) <= kept), "no per-site entries"
        assert all(_differs({k: s[k] for k in kept}, model) for s in sites), "the server has a site's entries"
    if cell.personal == "finetune" or personalized:
        sites = ran.sites()
        assert _differs(*sites), "the sites' models are equal"
        if cell.personal == "finetune":
            assert all(_differs(s, model) for s in sites), "fine-tuning left a site's model as the global one"
    if cell.selection == "best":
        selected = ran.summary["selected"]
        monitor = [row for row in ran.history if math.isfinite(float(row.get(selected["monitor"], math.nan)))]
        assert selected["selection"] == "best" and monitor
        assert selected["round"] in [row["round"] for row in monitor]
        assert selected["value"] == max(row[selected["monitor"]] for row in monitor)


def test_the_effect_check_sees_a_server_step_that_does_nothing(tmp_path):
    """The control of the ``[server]`` check: SGD with lr 1 and no momentum steps to the mean
    (x − 1·(x − mean)), which is no server optimizer; ``_apart`` must say so."""
    cell = Cell("localsgdm")
    plain = run(cell, tmp_path / "plain")
    identity = support.config(cell)
    identity.server = {"optimizer": "sgd", "lr": 1.0, "beta1": 0.0}
    from fedxrisk.experiment import run_experiment

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same = Ran(run_experiment(identity, tmp_path / "identity").summary, [], tmp_path / "identity")
    assert not _apart(plain, same)
    assert _apart(plain, run(replace(cell, server="adam"), tmp_path / "adam"))


SLOW_CELLS = [
    Cell("codasca", engine="distributed", server="adam"),
    Cell("localsgdm", engine="distributed", personal="head", privacy="none", selection="best"),
    Cell("localsgdm", engine="distributed", server="adam", personal="head"),  # the step spares the heads
    Cell("localsgdm", engine="distributed", privacy="instance"),
    Cell("codasca", engine="compile", personal="finetune"),
]


@pytest.mark.slow  # torchrun ranks, torch.compile
@pytest.mark.parametrize("cell", SLOW_CELLS, ids=_id)
def test_a_process_spawning_engine_runs_its_accepted_cells_as_the_loop_engine(cell, tmp_path):
    """distributed (``fedxrisk run --nproc-per-node 2``) and compile: accepted, and the model equals
    the loop engine's (without privacy noise)."""
    import json
    import os
    import subprocess

    assert support.verdicts()[cell] is None
    cfg = support.config(cell)
    if cell.privacy != "none":
        cfg = replace(cfg, privacy={**cfg.privacy, "reproducible_noise": 3})
    from fedxrisk.run.configfile import config_to_toml

    (tmp_path / "cfg.toml").write_text(config_to_toml(cfg))
    nproc = ["--nproc-per-node", "2"] if cell.engine == "distributed" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    done = subprocess.run(
        [sys.executable, "-m", "fedxrisk", "run", "--config", str(tmp_path / "cfg.toml"), *nproc, "--out", str(tmp_path / "d"), "-q"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["status"] == "completed"
    loop = run(replace(cell, engine="loop"), tmp_path / "loop", 3 if cell.privacy != "none" else None)
    assert max((ran - _entries(tmp_path / "d" / "model.pt")[k]).abs().max().item()
               for k, ran in loop.model().items()) < 1e-4  # fmt: skip
