"""``fedxrisk`` command line, one module per command: ``run`` (or resume) an experiment, ``compare``
settings, ``plot`` runs, ``evaluate`` and ``predict`` with a finished run, ``tune``
hyperparameters on validation, ``check`` a config (every error at once), ``list`` the choices.

:mod:`fedxrisk.cli.common` holds the ``main`` group and the shared options and error handling,
:mod:`fedxrisk.cli.progress` the progress bars. Importing this package registers every command and
imports no torch; nothing in the package imports the CLI.
"""

from fedxrisk.cli import check, compare, evaluate, listing, plot, predict, run, tune  # noqa: F401  (registers the commands)
from fedxrisk.cli.common import main

__all__ = ["main"]
