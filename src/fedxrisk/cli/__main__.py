"""``python -m fedxrisk.cli``: the ``fedxrisk`` command line."""

from fedxrisk.cli import main

main()
