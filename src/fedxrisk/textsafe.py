"""Text from users' files made safe to write or print.

:func:`csv_cell`: a cell a spreadsheet would run as a formula is prefixed with ``'``,
as OWASP's "CSV Injection" page recommends: a text cell starting with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return, unless the whole cell is a plain number
(``-1.5`` stays a number). Scores are numbers we format and are written as they are.

:func:`printable`: control characters (terminal escape codes, newlines, C1 codes)
in a path or name shown on the terminal are replaced by ``\\xNN`` / ``\\uNNNN`` escapes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def csv_cell(value: Any) -> Any:
    """``value`` as it may be written into a CSV cell (text cells only are changed)."""
    if isinstance(value, str) and value.startswith(FORMULA_START) and not NUMBER.match(value):
        return "'" + value
    return value


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any, keep: str = "") -> str:
    """``str(text)`` with every control character (Unicode category C*) escaped, except those in ``keep``
    (error messages keep the newlines of their layouts)."""
    return "".join(
        _escape(ch) if unicodedata.category(ch).startswith("C") and ch not in keep else ch for ch in str(text)
    )
