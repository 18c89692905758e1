"""Cross-silo deployment on Flower: one SuperLink, one SuperNode per site (``fedxrisk[flower]``).

The protocol (site runner, coordinator, site data) is plain Python and torch;
only :mod:`fedxrisk.flower.app` imports ``flwr``. See ``docs/flower.md``.
"""

from __future__ import annotations

FLWR_REQUIREMENT = "flwr>=1.41,<1.42"
DEFAULT_EVAL_DP = (1.0, 1e-5)  # (ε, δ) of the default private evaluation (flower/evaluate.py)
INSTALL_HINT = "the Flower deployment needs the optional extra: pip install 'fedxrisk[flower]'"


def require_flwr() -> None:
    """Raise a clear ImportError when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
