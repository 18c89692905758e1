"""The command line starts without torch: `fedxrisk --help`, `list` and argument errors stay light.

Timing is measured by benchmarks/timing/startup.py, not here; these tests check the
cause (which modules a command imports) and that the catalogue `list` reads
equals the registries it is generated from.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedxrisk import catalog

HEAVY = ("torch", "sklearn", "numpy", "scipy", "matplotlib")


def _imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_the_package_the_cli_help_list_and_an_argument_error_import_no_heavy_library():
    """One process runs them all: nothing heavy may be imported by any of them."""
    code = "import fedxrisk\nfedxrisk.RunConfig\nfrom fedxrisk.cli import main\n"
    for args in (["--help"], ["list"], ["run", "--help"], ["run", "--rounds", "x"], ["compare", "-a"]):
        code += f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
    assert _imported_after(code) == []


def test_the_package_attributes_are_the_modules_objects():
    import fedxrisk
    from fedxrisk import experiment
    from fedxrisk.run import recipes, spec

    assert fedxrisk.run_experiment is recipes.run_experiment is experiment.run_experiment
    assert fedxrisk.RunConfig is spec.RunConfig is experiment.RunConfig
    assert set(fedxrisk.__all__) <= set(dir(fedxrisk))


def test_the_committed_catalogue_equals_the_registries():
    built = json.loads(json.dumps(catalog.build()))
    assert catalog.load() == built, f"catalog.json is stale; refresh it with `{catalog.REFRESH}`"


CONFIG_ERRORS = {  # argument list → a piece of its one-line message (exit status 2)
    "lr": (["run", "--set", "algorithm.lr=abc"], "algorithm.lr: expected a number"),
    "unknown key": (["run", "--set", "data.imratoi=0.2"], "unknown key 'data.imratoi'"),
    "hyperparameter type": (["run", "--set", "algorithm.eta_g=x"], "algorithm.eta_g: expected a number"),
    "range": (["run", "--rounds", "0"], "experiment.rounds must be ≥ 1"),
    "schedule": (
        ["run", "--set", "algorithm.lr_decay=0.5"],
        "lr_decay and window_growth must be finite numbers ≥ 1",
    ),
    "no data dir": (["run", "--dataset", "cifar10"], "dataset 'cifar10' reads files: set data_dir"),
    "distributed without torchrun": (["run", "--engine", "distributed"], "rendezvous variable(s)"),
}


def _run_cli_in_a_fresh_process(calls: list[list[str]]) -> dict:
    """Each call's exit status and stderr, the heavy modules loaded and the CPU seconds used."""
    code = f"""
import contextlib, io, json, resource, sys
from fedxrisk.cli import main
out = []
for args in {calls!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main(args, standalone_mode=True)
        except SystemExit as e:
            out.append([e.code, err.getvalue()])
usage = resource.getrusage(resource.RUSAGE_SELF)
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps({{"calls": out, "heavy": heavy, "cpu": usage.ru_utime + usage.ru_stime}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_config_errors_print_their_line_and_exit_2_without_importing_torch(tmp_path):
    """Issue 25: every command cost ~3 s of CPU, a one-line config error included."""
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[data\nclients = 2\n")
    errors = {
        **CONFIG_ERRORS,
        "bad TOML": (["run", "--config", str(bad_toml)], "not valid TOML"),
        "missing data dir": (
            ["run", "--dataset", "folder", "--data-dir", str(tmp_path / "nowhere")],
            "does not exist; expected:",
        ),
    }
    result = _run_cli_in_a_fresh_process([args for args, _ in errors.values()])
    for (name, (_, piece)), (status, stderr) in zip(errors.items(), result["calls"], strict=True):
        assert status == 2, (name, stderr)
        assert stderr.startswith("Error: ") and piece in stderr, (name, stderr)
    assert "torch" not in result["heavy"] and "sklearn" not in result["heavy"], result["heavy"]
    assert result["cpu"] < 2.0, result  # importing torch alone costs ~2-3 s of CPU here


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_a_hyperparameter_range_error_is_still_found_by_the_algorithm_itself():
    """The algorithms' own range checks load torch; the message is the same one line."""
    result = _run_cli_in_a_fresh_process(
        [["run", "--set", "algorithm.algorithm=localsgdm", "--set", "algorithm.momentum=1.5"]]
    )
    [(status, stderr)] = result["calls"]
    assert status == 2 and "algorithm.momentum must lie in [0, 1), got 1.5" in stderr


def test_the_catalogue_answers_as_the_live_registry():
    """The config layer reads types, windows and step sizes from catalog.json until the registry
    is loaded: both answers agree (the same hint objects, not only the same text)."""
    import typing

    from fedxrisk.algorithms import ALGORITHMS

    committed = catalog.load()["algorithms"]
    live = catalog.table("algorithms")
    assert committed == json.loads(json.dumps(live))
    for name, cls in ALGORITHMS.items():
        hints = typing.get_type_hints(cls)
        for key, text in committed[name]["types"].items():
            hint = catalog.hint_of(text)
            if key in hints and "fedxrisk" not in repr(hints[key]):
                assert hint == hints[key], (name, key, hint, hints[key])
        assert committed[name]["window"] == cls.fixed_window
        assert committed[name]["default_lr"] == cls.default_lr


@pytest.mark.slow  # a real process (the range-error case stays quick)
def test_a_dataset_registered_by_the_user_passes_the_checks():
    """Once a registry module is imported the checks read the live registry, not catalog.json."""
    code = """
from fedxrisk.data.registry import register
from fedxrisk.run.configfile import load_config

@register("mine")
def mine():
    raise NotImplementedError

print(load_config(None, ['data.dataset="mine"']).dataset)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "mine"
