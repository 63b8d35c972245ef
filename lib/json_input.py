"""Reading JSON that came from the network."""

from __future__ import annotations

import json
from typing import Any


def parse_json(data: bytes | str) -> Any:
    """``json.loads`` for untrusted input: malformed, non-UTF-8 and too deeply nested documents all
    raise ``ValueError`` (for the last, ``json.loads`` itself raises ``RecursionError``)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
