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


def parse_json_object(data: bytes | str) -> dict:
    """A request body that must be a JSON object; an empty body is ``{}``. Raises ``ValueError``
    saying which rule it broke (``body is not valid JSON: ...``, ``body must be a JSON object``)."""
    if not data:
        return {}
    try:
        value = parse_json(data)
    except ValueError as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("body must be a JSON object")
    return value
