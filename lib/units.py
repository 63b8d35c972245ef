"""Memory sizes: parsing the memory strings of ``scalers.yaml`` (``512m``, ``2g``, ``1024k``) and
rendering byte counts, both as such a string and with IEC units for display (``1.5 GiB``).

The memory-string grammar is deliberately narrow: digits, an optional decimal fraction, optional
whitespace, then exactly one unit letter ``k``, ``m`` or ``g`` in either case. Multipliers are
binary (k = 1024, m = 1024**2, g = 1024**3) and the result is floored to whole bytes. Everything
else (no unit, ``b``, ``Gi``, ``GB``, leading or trailing spaces, the empty string) is refused.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

#: Byte multiplier per unit letter (lower-case) of a memory string.
MEMORY_UNITS: dict[str, int] = {"k": 1024, "m": 1024**2, "g": 1024**3}

#: A memory string as :func:`parse_memory` takes it (whole): a number and a unit, k, m or g.
#: ASCII digits only ("\d" would accept other scripts' digits); fullmatch so that a
#: trailing newline or space is refused too.
MEMORY_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)[ \t\n\r\f\v]*([kKmMgG])")
#: The JSON Schema ``format`` of a memory string (:data:`MEMORY_RE`); where one is used may bound
#: its size (a job's: 6m to 16 TiB), which no pattern can say.
MEMORY_FORMAT = "memory"

#: Display units of :func:`format_bytes_iec`, smallest first.
_IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


class InvalidMemoryFormat(ValueError):
    """A memory string that does not follow the grammar above.

    ``str(error)`` reads:
    ``Invalid memory format: "<s>". Expected format like "512m", "2g", or "1024k".``
    ``error.value`` holds the offending input.
    """

    def __init__(self, value: object):
        self.value = value
        shown = value if isinstance(value, str) else repr(value)
        super().__init__(f'Invalid memory format: "{shown}". Expected format like "512m", "2g", or "1024k".')


def parse_memory(value: str) -> int:
    """Parse a memory string into a whole number of bytes: ``"512m"`` → 536870912, ``"2G"`` →
    2147483648, ``"1024k"`` → 1048576, ``"1.5g"`` → 1610612736, ``"512 m"`` (whitespace only between
    number and unit). The decimal is evaluated exactly and floored (``"0.1k"`` → 102). Raises
    :class:`InvalidMemoryFormat` (a ``ValueError``) for anything else, non-strings included.
    """
    if not isinstance(value, str):
        raise InvalidMemoryFormat(value)
    match = MEMORY_RE.fullmatch(value)
    if match is None:
        raise InvalidMemoryFormat(value)
    number, unit = match.groups()
    return math.floor(Decimal(number) * MEMORY_UNITS[unit.lower()])


def format_memory(num_bytes: int) -> str:
    """Render a byte count in the largest unit that divides it exactly.

    ``format_memory(2147483648) == "2g"``, ``format_memory(1536) == "1.5k"`` (a count
    that no unit divides evenly is shown in ``k`` with up to three decimals), and
    ``format_memory(512) == "512b"``. For display only: the ``b`` form does not
    parse back.
    """
    if num_bytes < 0:
        raise ValueError(f"format_memory: negative byte count {num_bytes}")
    for unit in ("g", "m", "k"):
        mult = MEMORY_UNITS[unit]
        if num_bytes >= mult and num_bytes % mult == 0:
            return f"{num_bytes // mult}{unit}"
    if num_bytes >= 1024:
        return f"{num_bytes / 1024:.3f}".rstrip("0").rstrip(".") + "k"
    return f"{num_bytes}b"


def format_bytes_iec(value) -> str:
    """Format a byte count with binary units: ``1610612736`` → ``"1.5 GiB"``; ``None`` → ``"—"``."""
    if value is None or value == "":
        return "—"
    size = float(value)
    for unit in _IEC_UNITS:
        if abs(size) < 1024 or unit == _IEC_UNITS[-1]:
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.1f} {unit}".replace(".0 ", " ")
        size /= 1024
    return f"{size} B"  # pragma: no cover


def format_duration(seconds) -> str:
    """A duration to the two largest units: ``75`` → ``1m 15s``; ``90000`` → ``1d 1h``.
    A value that is not a number comes back as its text."""
    try:
        s = int(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def format_age(seconds: float) -> str:
    """How long ago, as the pages show it (and ``static/js/kici.js`` keeps counting it):
    ``12s ago``, ``5m ago``, ``3h 4m ago`` (under 48 h), ``3d ago``; negative counts as 0."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s ago"
    m = s // 60
    if m < 60:
        return f"{m}m ago"
    h = m // 60
    if h < 48:
        return f"{h}h {m % 60}m ago"
    return f"{h // 24}d ago"
