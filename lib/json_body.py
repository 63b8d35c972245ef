"""JSON request bodies as pydantic models: one definition is both the check of a body and its JSON
Schema, so the OpenAPI document cannot drift (docs/api-contract.md, "One source"). A
:class:`JsonBody` names its keys in camelCase and refuses a non-object and unknown keys; a field's
``BeforeValidator`` raises :class:`BodyRefused` in the project's wording (``<field>: <what is
wrong>, got <value>``), then pydantic holds the value to the declared type and constraints. An
absent required key reaches its check as :data:`MISSING`. :func:`validate_body` returns the model
or raises the first refusal.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from lib.query import shown
from lib.wording import json_text, key_path

#: The JSON Schema ``format`` of a string whose every character is printable (``str.isprintable``:
#: no control, format, line or paragraph separator, private-use, surrogate or unassigned character,
#: no space but " "), which no JSON Schema pattern can say in full. A client or fuzzer that does
#: not know the format ignores it; the check that enforces it words the refusal.
PRINTABLE_FORMAT = "printable"


class BodyRefused(ValueError):
    """A refused request body: ``field`` is the JSON path at fault (``labels[2]``,
    ``container.image``, ``body`` for the whole); ``message`` says what is wrong with it;
    ``str()`` reads ``<field>: <message>`` unless ``text`` words the whole refusal."""

    def __init__(self, field: str, message: str, *, text: str | None = None):
        self.field = field
        self.message = message
        super().__init__(text or f"{field}: {message}")


class _Missing:
    """The value a required key that is absent reaches its field's check with."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class JsonBody(BaseModel):
    """Base of a JSON body (module doc). ``body_path`` is where the object sits in the request
    (``body`` at the top, ``container`` for a nested one); ``extra="allow"`` in a subclass's
    ``model_config`` keeps unknown keys instead (the agent's own bodies, which a newer agent may grow)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)
    body_path: ClassVar[str] = "body"

    @model_validator(mode="before")
    @classmethod
    def _an_object_of_known_keys(cls, data: Any) -> Any:
        where = cls.body_path
        if not isinstance(data, dict):
            what = "a JSON object" if where == "body" else "an object"
            raise BodyRefused(where, f"must be {what}, got {json_text(data)}")
        keys = {field.alias or name: field for name, field in cls.model_fields.items()}
        if cls.model_config.get("extra") == "forbid":
            if unknown := sorted(set(data) - set(keys)):
                field = key_path("" if where == "body" else where, unknown[0])
                message = f"unknown field (allowed: {', '.join(sorted(keys))})"
                raise BodyRefused(field, message, text=f"{shown(field)}: {message}")
        absent = {key: MISSING for key, field in keys.items() if field.is_required() and key not in data}
        return {**data, **absent} if absent else data


def _path(loc: tuple, where: str) -> str:
    path = "" if where == "body" else where
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else key_path(path, str(part))
    return path or where


def validate_body[M: JsonBody](model: type[M], payload: Any) -> M:
    """``payload`` (parsed JSON) as ``model``; raises :class:`BodyRefused` for its first refusal:
    a field's own check as it worded it, else pydantic's word for the constraint it broke."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        error = first.get("ctx", {}).get("error")
        if isinstance(error, BodyRefused):
            raise error from None
        field = _path(first["loc"], model.body_path)
        raise BodyRefused(field, f"{first['msg']}, got {json_text(first['input'])}") from None
