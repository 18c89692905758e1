"""The command line starts without torch: `fedxrisk --help`, `list` and argument errors stay light.

Timing is measured by benchmarks/startup.py, not here; these tests check the
cause (which modules a command imports) and that the catalogue `list` reads
equals the registries it is generated from.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
