"""Algorithm names as the papers write them resolve to the registry key; misspellings get a suggestion."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.cli import main
from fedxrisk.compare import build_variants
from fedxrisk.experiment import ConfigError
from fedxrisk.run.configfile import load_config
from fedxrisk.run.names import normalise, resolve


@pytest.mark.parametrize(
    "written, key",
    [("FCSG-M", "fcsg_m"), ("CODA+", "codaplus"), ("CoDA+", "codaplus"), ("Acc-FCSG-M", "acc_fcsg_m"),
     ("LocalSCGDAM", "localscgdam"), ("Local-SCGDM", "local_scgdm"), ("FeDXL2", "fedxl2"), ("CODASCA", "codasca"),
     ("LocalSGDM_RL", "localsgdm_rl"), ("codaplus", "codaplus")],
)  # fmt: skip
def test_paper_spellings_resolve_to_the_registry_key(written, key):
    assert resolve(written, ALGORITHMS) == key


def test_normalised_names_are_unique_in_the_registry():
    assert len({normalise(n) for n in ALGORITHMS}) == len(ALGORITHMS)


def test_a_misspelling_suggests_the_closest_name():
    with pytest.raises(
        ConfigError, match=r"^unknown algorithm 'codsca' \(did you mean 'codasca'\?\); choose one of"
    ):
        resolve("codsca", ALGORITHMS)
    with pytest.raises(ConfigError, match=r"^x: unknown algorithm 'FCSG-MM' \(did you mean 'fcsg_m'\?\)"):
        resolve("FCSG-MM", ALGORITHMS, "x")


def test_configs_and_compare_record_the_canonical_name():
    assert load_config(None, ["algorithm.algorithm=CODA+"]).algorithm == "codaplus"
    variants = build_variants({"experiment": {"rounds": 2}}, ["FCSG-M", "LocalSCGDAM"], None, [0])
    assert [v.configs[0].algorithm for v in variants] == ["fcsg_m", "localscgdam"]
    assert [v.label for v in variants] == ["fcsg_m", "localscgdam"]


def test_cli_suggests_a_name_for_a_misspelled_algorithm():
    result = CliRunner().invoke(main, ["run", "--algorithm", "Acc-FCSG", "--rounds", "1"])
    assert result.exit_code == 2
    assert "unknown algorithm 'Acc-FCSG' (did you mean 'acc_fcsg_m'?)" in result.output
