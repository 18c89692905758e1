"""Algorithm names as the papers write them: ``FCSG-M``, ``CODA+``, ``Acc-FCSG-M``, ``LocalSCGDAM``.

A name resolves to its registry key when the two agree after normalising
case, ``-``, ``_``, spaces and ``+`` (read as "plus"); the canonical key is
what configs and summaries record. Anything else is an error that suggests
the closest key.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from fedxrisk.errors import ConfigError


def normalise(name: str) -> str:
    """``Acc-FCSG-M`` → ``accfcsgm``; ``CODA+`` → ``codaplus``."""
    return re.sub(r"[\s_\-.]+", "", name.lower().replace("+", "plus"))


def resolve(name: str, names: Iterable[str], where: str | None = None) -> str:
    """The registry key ``name`` stands for; :class:`ConfigError` with a "did you mean" otherwise."""
    names = list(names)
    if name in names:
        return name
    keys = {normalise(n): n for n in names}
    if normalise(name) in keys:
        return keys[normalise(name)]
    close = difflib.get_close_matches(normalise(name), list(keys), n=1, cutoff=0.6)
    hint = f" (did you mean {keys[close[0]]!r}?)" if close else ""
    prefix = f"{where}: " if where else ""
    raise ConfigError(f"{prefix}unknown algorithm {name!r}{hint}; choose one of {sorted(names)}")
