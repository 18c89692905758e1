"""``python -m fedxrisk``: the ``fedxrisk`` command line."""

from fedxrisk.cli import main

main()
