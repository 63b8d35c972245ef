"""Searching an agent's whole kept output: every line a console page could load, not only the loaded
ones. A query is a plain substring (case-insensitive unless asked) or a regular expression whose
cost is bounded before it runs (:func:`compile_query`: :data:`MAX_PATTERN_CHARS`, no
backreference or lookaround, no nested repeat, :data:`MAX_REPEATS`), since ``re`` cannot be
interrupted inside a line; the scan stops after ``seconds`` (:func:`search_lines`), saying where.
Lines come numbered as the console numbers them (:func:`file_lines`,
``consolelog.dockerlogs.container_lines``). Design: docs/live-streams.md ("The console page").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Generator, Iterable, Iterator
from typing import NamedTuple

from .cap import COUNT_CHUNK_BYTES, cut_lines, kept_start, numbering_lock
from .tail import MAX_LINE_BYTES, LineSplitter

#: Longest query, in characters.
MAX_PATTERN_CHARS = 200
#: Most repeats (``*``, ``+``, ``?``, ``{m,n}``) in one regular expression.
MAX_REPEATS = 8
#: Characters of a hit's line sent back (the part around its first match).
EXCERPT_CHARS = 240
#: Characters shown before the first match when the line is cut for its excerpt.
EXCERPT_BEFORE = 60
#: Lines between two checks of the time budget.
CHECK_EVERY = 512


def compile_query(text: str, *, regex: bool = False, case: bool = False) -> re.Pattern[str]:
    """The pattern of query ``text``: its literal text (``regex`` False) or a regular expression,
    ignoring case unless ``case``. Raises ValueError naming the field ``q`` for an empty or too
    long query, an invalid expression (with ``re``'s message and position) or one whose cost is
    not bounded (see the module)."""
    if not text:
        raise ValueError("q: is required (the text to search for)")
    if len(text) > MAX_PATTERN_CHARS:
        raise ValueError(f"q: at most {MAX_PATTERN_CHARS} characters, got {len(text)}")
    flags = 0 if case else re.IGNORECASE
    if not regex:
        return re.compile(re.escape(text), flags)
    try:
        parsed = re._parser.parse(text, flags)  # type: ignore[attr-defined]
    except re.error as exc:
        raise ValueError(f"q: not a valid regular expression: {exc}") from None
    repeats = _check_cost(parsed.data if hasattr(parsed, "data") else list(parsed), inside_repeat=False)
    if repeats > MAX_REPEATS:
        raise ValueError(f"q: at most {MAX_REPEATS} repeats (*, +, ?, {{m,n}}) in a regular expression, got {repeats}")
    pattern = re.compile(text, flags)
    if pattern.search("") is not None:
        raise ValueError(f"q: the regular expression {text!r} matches an empty text, so every line")
    return pattern


_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


def _check_cost(items, *, inside_repeat: bool) -> int:
    """The repeats in parsed ``items`` (``re._parser`` tuples); ValueError for a construct whose
    matching time can grow beyond polynomial in the line's length."""
    count = 0
    for op, arg in items:
        name = str(op)
        if name in ("GROUPREF", "GROUPREF_EXISTS"):
            raise ValueError("q: a backreference is not allowed in a search (its cost has no bound)")
        if name in ("ASSERT", "ASSERT_NOT"):
            raise ValueError("q: a lookahead or lookbehind is not allowed in a search (its cost has no bound)")
        if name in _REPEATS:
            _low, high, body = arg
            if inside_repeat and high > 1:
                raise ValueError(
                    "q: a repeat inside a repeat, such as (a+)+, is not allowed in a search (its cost has no bound)"
                )
            count += 1 + _check_cost(body, inside_repeat=inside_repeat or high > 1)
        elif name == "SUBPATTERN":
            count += _check_cost(arg[-1], inside_repeat=inside_repeat)
        elif name == "BRANCH":
            count += sum(_check_cost(branch, inside_repeat=inside_repeat) for branch in arg[1])
        elif name == "ATOMIC_GROUP":
            count += _check_cost(arg, inside_repeat=inside_repeat)
    return count


class Hit(NamedTuple):
    """A line that matched: its number, an excerpt of its text (:data:`EXCERPT_CHARS` around the
    first match, "…" where cut) and the ``[start, end)`` spans of the matches in the excerpt."""

    n: int
    excerpt: str
    marks: list[tuple[int, int]]


class Found(NamedTuple):
    """What a search found: up to ``limit`` hits (numbered after ``after``), ``more`` hits beyond
    them, the lines searched (``first`` to ``last``, ``scanned`` of them) and whether the time
    budget ran out (``stopped``: the lines after ``last`` were not searched)."""

    hits: list[Hit]
    more: int
    first: int
    last: int
    scanned: int
    stopped: bool


def excerpt(text: str, pattern: re.Pattern[str]) -> tuple[str, list[tuple[int, int]]]:
    """``text`` cut to :data:`EXCERPT_CHARS` around its first match of ``pattern``, with the
    spans of the matches inside the cut."""
    first = pattern.search(text)
    start = 0
    if first is not None and len(text) > EXCERPT_CHARS and first.start() > EXCERPT_BEFORE:
        start = min(first.start() - EXCERPT_BEFORE, len(text) - EXCERPT_CHARS)
    end = min(len(text), start + EXCERPT_CHARS)
    prefix = "…" if start else ""
    shown = prefix + text[start:end] + ("…" if end < len(text) else "")
    marks = []
    for match in pattern.finditer(text, start, end):
        if match.end() > match.start():
            marks.append((match.start() - start + len(prefix), match.end() - start + len(prefix)))
    return shown, marks


def search_lines(
    lines: Iterable[tuple[int, str]],
    pattern: re.Pattern[str],
    *,
    after: int = 0,
    limit: int = 200,
    seconds: float = 10.0,
) -> Found:
    """Search numbered ``lines`` (ascending) for ``pattern``: the first ``limit`` hits numbered
    above ``after``, and a count of the rest. Stops once ``seconds`` have passed (``stopped``)."""
    deadline = time.monotonic() + seconds
    hits: list[Hit] = []
    more = scanned = 0
    first = last = 0
    stopped = False
    search = pattern.search
    for n, text in lines:
        if not first:
            first = n
        last = n
        scanned += 1
        if n > after and search(text) is not None:
            if len(hits) < limit:
                hits.append(Hit(n, *excerpt(text, pattern)))
            else:
                more += 1
        if scanned % CHECK_EVERY == 0 and time.monotonic() > deadline:
            stopped = True
            break
    return Found(hits, more, first, last, scanned, stopped)


def file_lines(fd: int, max_line: int = MAX_LINE_BYTES) -> Generator[tuple[int, str]]:
    """Every kept line of the log file ``fd``, numbered as the console numbers it (the lines cuts
    freed counted: ``consolelog.cap.line_number_at``), capped and split as ``consolelog.tail``
    shows them, read :data:`consolelog.cap.COUNT_CHUNK_BYTES` at a time up to the size it had
    when the read began, under the shared numbering lock. Raises ``OSError`` from reading."""
    with numbering_lock(fd):
        number = cut_lines(fd) + 1
        offset = kept_start(fd)
        size = os.fstat(fd).st_size
        splitter = LineSplitter(max_line)
        while offset < size:
            data = os.pread(fd, min(COUNT_CHUNK_BYTES, size - offset), offset)
            if not data:
                break
            offset += len(data)
            for text in splitter.feed(data):
                yield number, text
                number += 1
        for text in splitter.flush():
            yield number, text
            number += 1


#: Seconds a regular expression's child process may run beyond the search's own budget.
KILL_GRACE_SECONDS = 2.0


def search_regex_bounded(
    lines: Iterable[tuple[int, str]],
    text: str,
    *,
    case: bool = False,
    after: int = 0,
    limit: int = 200,
    seconds: float = 10.0,
) -> Found:
    """:func:`search_lines` for the regular expression ``text`` (checked by :func:`compile_query`)
    in a child process, killed when it runs :data:`KILL_GRACE_SECONDS` past ``seconds``: ``re``
    cannot be stopped inside one line, and a console line may hold 64 Ki characters written by the
    sandbox. Raises ValueError naming ``q`` for a bad expression or one the child had to be killed
    over; RuntimeError when the child failed otherwise."""
    compile_query(text, regex=True, case=case)
    header = json.dumps({"q": text, "case": case, "after": after, "limit": limit, "seconds": seconds})
    body = "".join(f"{n}\t{line}\n" for n, line in lines)
    child = subprocess.Popen(
        [sys.executable, "-m", "consolelog.search"],
        cwd=_PACKAGE_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = child.communicate((header + "\n" + body).encode(), timeout=seconds + KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise ValueError(
            f"q: the regular expression {text!r} took more than {seconds:g} s over one line; make it more specific"
        ) from None
    if child.returncode != 0:
        raise RuntimeError(f"the search process failed ({child.returncode}): {err.decode(errors='replace')[-500:]}")
    data = json.loads(out)
    return Found([Hit(n, shown, [tuple(m) for m in marks]) for n, shown, marks in data["hits"]], *data["rest"])


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child() -> None:
    """The child of :func:`search_regex_bounded`: a JSON header line, then ``number\\ttext`` lines
    on stdin; the :class:`Found` as JSON on stdout."""
    stream = sys.stdin.buffer
    header = json.loads(stream.readline())
    pattern = compile_query(header["q"], regex=True, case=header["case"])

    def lines() -> Iterator[tuple[int, str]]:
        for raw in stream:
            number, _, text = raw.decode().rstrip("\n").partition("\t")
            yield int(number), text

    found = search_lines(lines(), pattern, after=header["after"], limit=header["limit"], seconds=header["seconds"])
    json.dump({"hits": [list(hit) for hit in found.hits], "rest": list(found[1:])}, sys.stdout)


if __name__ == "__main__":
    _child()
