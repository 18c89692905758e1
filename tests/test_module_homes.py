"""Names that moved in the issue-24 split still resolve, to the very objects of their new homes."""

from __future__ import annotations

import subprocess
import sys

import fedxrisk.engines as engines
from fedxrisk.algorithms import ALGORITHMS, coda, coda_baselines, fedxl, localpair, pairwise_base
from fedxrisk.engines import dist_collective, distributed, launch, simulation
from fedxrisk.flower import replay, site
from fedxrisk.run import spec as runconfig


def test_the_distributed_engine_re_exports_the_names_its_importers_use():
    for name in ("check_launch", "client_layout", "launched_rank", "DEFAULT_TIMEOUT"):
        assert getattr(distributed, name) is getattr(launch, name), name
    assert distributed.DistGroup is dist_collective.DistGroup
    assert distributed.DistCollective is engines.DistCollective is dist_collective.DistCollective
    assert runconfig.DEFAULT_TIMEOUT is launch.DEFAULT_TIMEOUT == 300.0


def test_the_engines_package_resolves_its_names_on_first_use():
    assert engines.Simulation is simulation.Simulation
    assert engines.DistributedSimulation is distributed.DistributedSimulation
    assert engines.ENGINE_NAMES == (*simulation.ENGINES, "distributed")
    try:
        engines.NoSuchEngine  # noqa: B018
    except AttributeError as e:
        assert "NoSuchEngine" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_the_launch_checks_import_no_torch():
    code = "import fedxrisk.engines.launch, sys; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_algorithms_keep_their_registered_names_and_order():
    assert ALGORITHMS["localpair"] is localpair.LocalPair
    assert ALGORITHMS["coda"] is coda_baselines.CoDA and ALGORITHMS["npa"] is coda_baselines.NPA
    assert issubclass(ALGORITHMS["fedxl1"], pairwise_base.PairwiseBase)
    assert fedxl.log_u_in_order is pairwise_base.log_u_in_order
    names = list(ALGORITHMS)
    assert names[:4] == ["codaplus", "codasca", "coda", "npa"]
    assert names.index("fedxl1") + 2 == names.index("localpair")
    assert coda.CODAPlus in ALGORITHMS["npa"].__mro__


def test_the_flower_site_still_offers_the_replay_collective():
    assert site.ReplayCollective is replay.ReplayCollective
    assert site.SiteError is replay.SiteError and site.CollectiveRequest is replay.CollectiveRequest
