"""How values are written into the messages people and callers read: a refused value as it would be
written in JSON, and a list (a job's labels, a hostAccess list) as an operator reads it. One home,
so every validator and page writes a value the same way, never as a Python repr."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

#: Characters of a value repeated in a message, at most (a longer one is cut, marked "...").
SHOWN_VALUE_CHARS = 60

#: What a key written bare in a field path must not hold: the path's own punctuation.
_PATH_PUNCTUATION = re.compile(r'[.\[\]"]')


def key_path(parent: str, key: str) -> str:
    """The field path of ``key`` inside ``parent`` ("" at the top): ``parent.key``, or
    ``parent["key"]`` (the key as JSON, :func:`json_text`) for an empty key or one holding ``.``,
    ``[``, ``]`` or ``"``, so a path is never empty (the key ``""`` is ``[""]``) and never reads
    two ways (``["a.b"]`` is one key)."""
    if key and not _PATH_PUNCTUATION.search(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json_text(key)}]"


def json_text(value: Any) -> str:
    """``value`` as the caller wrote it in JSON (``null``, ``true``, ``"x"``, ``["a", 1]``), at most
    :data:`SHOWN_VALUE_CHARS` characters; a value JSON cannot write falls back to its ``repr``.
    Letters of any script are shown as they are (``"tök"``, not ``"t\\u00f6k"``); what cannot be
    seen (controls, bidi overrides, zero-width and odd spaces) is written as its JSON escape."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = visible_text(text)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 3] + "..."


#: Characters :func:`visible_text` keeps though they print nothing: a text's own layout.
_LAYOUT = frozenset("\n\t")


def visible_text(text: str) -> str:
    """``text`` with every character that cannot be seen (controls, bidi overrides and isolates
    such as U+202E, zero-width and odd spaces: what ``str.isprintable`` refuses) written as its
    JSON escape (``\\u202e``), so text an agent, its sandbox or the orchestrator supplied cannot
    reorder or hide what a page shows around it. Line breaks and tabs are kept (multi-line
    details). The one rule for such text, in messages and on pages (the ``visible`` filter)."""
    return "".join(ch if ch.isprintable() or ch in _LAYOUT else _escaped(ch) for ch in text)


def header_text(value: str) -> str:
    """A request header's value as the client sent it, for a message that repeats it. Servers hand
    Django each header byte as one latin-1 character, so UTF-8 sent as ``café`` arrives as
    ``cafÃ©``: the bytes are read back as UTF-8 (what a client that sends non-ASCII means), and
    bytes that are not UTF-8 are shown as ``\\xNN`` escapes, never as mojibake."""
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return value  # not from the wire (a test client's own text): already what was meant
    return raw.decode("utf-8", "backslashreplace")


def _escaped(ch: str) -> str:
    """``ch`` as JSON escapes it (a surrogate pair above the BMP)."""
    return json.dumps(ch)[1:-1]


def listed(items: Iterable[object]) -> str:
    """``items`` as an operator reads a list: ``[linux, x]``, ``[]`` for none. Items are shown as
    they are, unquoted, so this is for words that hold no ", " (labels, hostAccess entries)."""
    return "[" + ", ".join(str(item) for item in items) + "]"
