"""The query-string rules of every page and ``/api/v1`` list: a view names the parameters it takes,
each given once unless it takes several, numbers are whole and within a stated range. Anything else
is refused with :class:`BadParameter` naming the parameter and the value, never dropped: a list that
quietly ignores a misspelt, repeated or out-of-range parameter shows what nobody asked for.

Messages read ``<name>: <what is wrong>, got <value>``, the value quoted as JSON
(``lib.wording.json_text``) like the refusals of a JSON body."""

from __future__ import annotations

import re

from lib.wording import json_text, key_path

#: Characters of a refused parameter name repeated in a message (the rest is cut, marked "…").
SHOWN_CHARS = 100


def shown(text: str) -> str:
    """``text`` cut to :data:`SHOWN_CHARS` characters for a message, "…" marking a cut."""
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


class BadParameter(ValueError):
    """A refused query parameter: ``field`` is its name, ``str()`` reads ``"<field>: <problem>"``."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{shown(field)}: {problem}")
        self.field = field


def check_parameters(params, single: tuple[str, ...] = (), several: tuple[str, ...] = ()) -> None:
    """Refuse a query the view cannot honour in full: ``params`` (a ``QueryDict``) may hold only the
    names in ``single`` (each at most once) and ``several`` (repeatable: the view takes every value).
    BadParameter naming the first unknown parameter (with the accepted names) or repeated one (with
    its values)."""
    accepted = (*single, *several)
    for name, values in params.lists():
        if name not in accepted:
            takes = ", ".join(accepted) if accepted else "no parameters"
            raise BadParameter(name or key_path("", name), f"unknown parameter (accepted: {takes})")
        if name in single and len(values) > 1:
            given = ", ".join(json_text(value) for value in values[:5])
            raise BadParameter(name, f"takes one value, got {len(values)}: {given}")


_WHOLE = re.compile(r"-?[0-9]+")


def whole_number(name: str, raw: str | None, low: int, high: int, default: int | None = None, hint: str = "") -> int:
    """The query value ``raw`` of parameter ``name`` as an integer within ``low..high``, inclusive;
    ``default`` when it is absent or empty. BadParameter naming the range for anything else (with
    ``hint`` after it for a value above the range), and for an absent value without a ``default``."""
    span = f"a whole number within {low}..{high}"
    if raw is None or raw == "":
        if default is None:
            raise BadParameter(name, f"is required ({span})")
        return default
    if not _WHOLE.fullmatch(raw):  # int() would also take "２", " 2" and "2_0"
        raise BadParameter(name, f"must be {span}, got {json_text(raw)}")
    value = int(raw)
    if not low <= value <= high:
        raise BadParameter(name, f"must be {span}{hint if value > high else ''}, got {json_text(value)}")
    return value


def choice(name: str, raw: str | None, choices) -> str:
    """The query value ``raw`` of parameter ``name`` when it is one of ``choices`` (strings), ``""``
    when absent or empty. BadParameter listing the choices for any other value."""
    if not raw:
        return ""
    if raw not in choices:
        raise BadParameter(name, f"must be one of {', '.join(choices)}, got {json_text(raw)}")
    return raw
