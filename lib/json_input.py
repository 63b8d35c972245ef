"""Reading JSON that came from the network."""

from __future__ import annotations

import json
from typing import Any

#: Longest integer literal accepted (Python's own conversion limit, stated in the error).
MAX_INT_DIGITS = 4300


class JsonRefused(ValueError):
    """Well-formed JSON this project does not take: a key twice in one object, an integer too long."""


def _object(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise JsonRefused(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonRefused(f"a number has {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def parse_json(data: bytes | str) -> Any:
    """``json.loads`` for untrusted input: malformed, non-UTF-8 and too deeply nested documents
    raise ``ValueError``; a key repeated in one object (which value would count is a guess) or an
    integer over :data:`MAX_INT_DIGITS` digits raise :class:`JsonRefused`, a ``ValueError``."""
    try:
        return json.loads(data, object_pairs_hook=_object, parse_int=_integer)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_json_object(data: bytes | str) -> dict:
    """A request body that must be a JSON object; an empty body is ``{}``. Raises ``ValueError``
    saying which rule it broke (``body is not valid JSON: ...``, ``body refused: key 'labels'
    appears twice in one object``, ``body must be a JSON object``)."""
    if not data:
        return {}
    try:
        value = parse_json(data)
    except JsonRefused as exc:
        raise ValueError(f"body refused: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("body must be a JSON object")
    return value
