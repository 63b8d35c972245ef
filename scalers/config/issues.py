"""Validation problems of ``scalers.yaml``: :class:`SchemaIssue`, and pydantic errors turned into
issues with the reference's wording and document paths (SPEC (a))."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

# Tags of the two resource shapes; stripped from error paths (see _loc).
_NESTED = "__nested__"
_FLAT = "__flat__"


@dataclass(frozen=True)
class SchemaIssue:
    """One validation problem: ``path`` (keys and list indexes from the document root)
    and a human ``message`` that names the offending value where there is one."""

    path: tuple[str | int, ...]
    message: str

    @property
    def dotted_path(self) -> str:
        """zod-style dotted path, e.g. ``scalers.0.labelSets.1.labels``."""
        return ".".join(str(p) for p in self.path)

    def __str__(self) -> str:
        return f"{self.dotted_path or '(document)'}: {self.message}"


def describe_value(value: Any, limit: int = 80) -> str:
    """Short JSON-ish rendering of an input value for error messages."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _loc(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    return tuple(p for p in loc if p not in (_NESTED, _FLAT))


_PLAIN_MESSAGES = {
    "string_type": "Expected a string",
    "bool_type": "Expected true or false",
    "list_type": "Expected a list",
    "dict_type": "Expected a mapping",
    "model_type": "Expected a mapping",
    "model_attributes_type": "Expected a mapping",
}


def _issue_message(err: dict[str, Any]) -> str:
    kind = err["type"]
    loc = err.get("loc", ())
    received = describe_value(err.get("input"))
    if kind == "missing":
        return "Required"
    if kind == "extra_forbidden":
        return f'Unrecognized key "{loc[-1] if loc else "?"}" (unrecognized_keys)'
    if kind == "value_error":
        return str(err.get("ctx", {}).get("error", err["msg"]))
    if kind in ("number_type", "int_type", "version") and "received" in err["msg"]:
        return err["msg"]
    if kind == "resources_shape":
        return f"{err['msg']}, received {received}"
    if kind == "too_short":
        ctx = err.get("ctx", {})
        return f"Expected at least {ctx.get('min_length', 1)} item(s), received {received}"
    if kind in _PLAIN_MESSAGES:
        return f"{_PLAIN_MESSAGES[kind]}, received {received}"
    return f"{err['msg']}, received {received}"


def _issues_from(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[SchemaIssue]:
    return [SchemaIssue(prefix + _loc(err["loc"]), _issue_message(err)) for err in exc.errors(include_url=False)]
