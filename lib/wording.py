"""How values are written into the messages people and callers read: a refused value as it would be
written in JSON. One home, so every validator quotes a value the same way."""

from __future__ import annotations

import json
from typing import Any

#: Characters of a value repeated in a message, at most (a longer one is cut, marked "...").
SHOWN_VALUE_CHARS = 60


def json_text(value: Any) -> str:
    """``value`` as the caller wrote it in JSON (``null``, ``true``, ``"x"``, ``["a", 1]``), at most
    :data:`SHOWN_VALUE_CHARS` characters; a value JSON cannot write falls back to its ``repr``."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 3] + "..."
