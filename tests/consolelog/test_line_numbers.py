"""A log file's line numbers (consolelog.cap, consolelog.tail): counted from the real start, across cuts."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

import consolelog.cap
from consolelog.cap import (
    CUT_LINES_XATTR,
    cap_file,
    count_lines,
    line_number_at,
    numbering_lock,
    read_end_numbered,
)
from consolelog.tail import MAX_READ_BYTES, FileTail, LineNumber, SkipMarker, read_lines_before, split_lines


def numbered_log(count: int, every_empty: int = 7) -> bytes:
    """``count`` lines ``line <n> …`` (n from 1), an empty line after every ``every_empty``th."""
    parts = []
    for n in range(1, count + 1):
        parts.append(b"line %d %s\n" % (n, b"x" * (n % 150)))
        if n % every_empty == 0:
            parts.append(b"\n\n" if n % 2 else b"\n")
    return b"".join(parts)


def open_rw(path) -> int:
    return os.open(path, os.O_RDWR)


def test_count_lines_counts_what_the_splitter_shows():
    for data in (b"", b"a\n", b"\n", b"\n\na\n\n\nb\n", b"a\r\n\n", b"abc", b"a\nb", numbered_log(500)):
        complete = data[: data.rfind(b"\n") + 1]
        assert count_lines(complete) == len(split_lines([complete])), data[:40]
    assert count_lines(b"\nb\n", at_line_start=False) == 2  # the rest of a line, then b


def test_line_numbers_are_the_places_of_the_lines_the_tail_shows(tmp_path):
    path = tmp_path / "log"
    data = numbered_log(3000)
    path.write_bytes(data)
    fd = open_rw(path)
    try:
        with numbering_lock(fd):
            assert line_number_at(fd, 0) == 1
            at = data.index(b"line 2000 ")
            assert line_number_at(fd, at) == 2000
            assert line_number_at(fd, at + 3) == 2001  # inside line 2000: a tail starting there skips it
            assert line_number_at(fd, len(data)) == 3001
    finally:
        os.close(fd)


def test_a_cut_keeps_the_numbers_of_the_lines_it_keeps(tmp_path):
    path = tmp_path / "log"
    data = numbered_log(20_000)
    path.write_bytes(data)
    fd = open_rw(path)
    try:
        assert cap_file(fd, len(data) // 2) > 0
        cut = int(os.getxattr(fd, CUT_LINES_XATTR))
        assert cut > 10_000
        oldest, first, lines = read_lines_before(fd, 20_001, 500)
        assert (oldest, first) == (cut + 1, 19_501)
        assert [int(line.split()[1]) for line in lines] == list(range(19_501, 20_001))
        # The oldest kept line is the line numbered so, and nothing before it is served.
        oldest, first, lines = read_lines_before(fd, cut + 4, 500)
        assert first == cut + 1 and [int(line.split()[1]) for line in lines] == [cut + 1, cut + 2, cut + 3]
        assert read_lines_before(fd, cut + 1, 500) == (cut + 1, cut + 1, [])
        # A second cut adds to the first.
        with open(path, "ab") as f:
            f.write(numbered_log(30_000)[len(data) :])
        assert cap_file(fd, len(data) // 2) > 0
        assert int(os.getxattr(fd, CUT_LINES_XATTR)) > cut
        oldest, first, lines = read_lines_before(fd, 30_001, 3)
        assert [line.split()[1] for line in lines] == ["29998", "29999", "30000"]
        with numbering_lock(fd):
            size = os.fstat(fd).st_size
            assert line_number_at(fd, size) == 30_001
    finally:
        os.close(fd)


def test_read_lines_before_serves_any_page_of_the_file(tmp_path):
    path = tmp_path / "log"
    data = numbered_log(40_000)  # more than one counting chunk
    assert len(data) > 2 * MAX_READ_BYTES
    path.write_bytes(data)
    shown = split_lines([data])
    fd = open_rw(path)
    try:
        for before, limit in ((40_001, 500), (1_000, 500), (20_000, 1), (2, 10), (1, 10), (40_003, 5)):
            oldest, first, lines = read_lines_before(fd, before, limit)
            assert oldest == 1
            assert first == max(1, before - limit)
            assert lines == shown[first - 1 : min(before, 40_001) - 1], (before, limit)
        assert read_lines_before(fd, 50_000, 5) == (1, 50_000, [])  # none of those lines exist yet
    finally:
        os.close(fd)


async def batches_until(tail: FileTail, done) -> list[str]:
    got: list[str] = []
    stop = asyncio.Event()
    async with asyncio.timeout(10):
        async for batch in tail.batches(stop):
            got.extend(batch)
            if done(got):
                stop.set()
    return got


def numbers_of(got) -> list[int]:
    """Each shown line's number as a reader of a numbered tail counts it."""
    out, next_number = [], None
    for text in got:
        if isinstance(text, LineNumber):
            next_number = text.number
        elif not isinstance(text, SkipMarker):
            assert int(text.split()[1]) == next_number, (text, next_number)
            out.append(next_number)
            next_number += 1
    return out


async def test_a_numbered_tail_numbers_from_an_offset_and_notes_what_was_there(tmp_path):
    path = tmp_path / "log"
    data = numbered_log(5_000)
    path.write_bytes(data)
    start = len(data) - 10_000  # mid-line, as a pump's backlog start
    tail = FileTail(path, start_offset=start, numbered=True, create=False, poll_interval=0.02)
    got = await batches_until(tail, lambda got: got and isinstance(got[-1], str) and got[-1].startswith("line 5000 "))
    assert isinstance(got[0], LineNumber) and got[0].live_from == 5_001
    numbers = numbers_of(got)
    assert numbers == list(range(numbers[0], 5_001)) and numbers[0] > 4_000


async def test_a_numbered_tail_that_skips_ahead_says_where_it_landed(tmp_path):
    path = tmp_path / "log"
    data = numbered_log(200_000)
    path.write_bytes(data)
    tail = FileTail(path, numbered=True, pace=True, max_lag_bytes=4 * MAX_READ_BYTES, poll_interval=0.02)
    got = await batches_until(tail, lambda got: got and isinstance(got[-1], str) and got[-1].startswith("line 200000 "))
    skips = [i for i, text in enumerate(got) if isinstance(text, SkipMarker)]
    assert skips and isinstance(got[skips[0] + 1], LineNumber)
    numbers = numbers_of(got)  # every line carries its own number, before and after the jump
    assert numbers[-1] == 200_000 and len(numbers) < 100_000


def test_a_cut_that_cannot_free_leaves_the_count_alone(tmp_path, monkeypatch):
    def no_holes(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    path = tmp_path / "log"
    data = numbered_log(5_000)
    path.write_bytes(data)
    fd = open_rw(path)
    try:
        monkeypatch.setattr(consolelog.cap, "punch_hole", no_holes)
        for _ in range(2):  # every round of the sweeper tries again
            with pytest.raises(OSError):
                cap_file(fd, len(data) // 2)
        assert consolelog.cap.cut_lines(fd) == 0
        with numbering_lock(fd):
            assert line_number_at(fd, len(data)) == 5_001
    finally:
        os.close(fd)


def test_the_kept_end_of_a_file_says_the_number_of_its_first_line(tmp_path):
    path = tmp_path / "log"
    data = numbered_log(20_000)
    path.write_bytes(data)
    fd = open_rw(path)
    try:
        # Uncut, from inside a line: its first line is the rest of that line, numbered as it.
        for limit in (1000, 1001, 1002, 4321):
            first, end = read_end_numbered(fd, limit)
            start = len(data) - limit
            assert end == data[start:]
            line_start = data.rfind(b"\n", 0, start) + 1
            assert first == int(data[line_start:].split()[1]), limit
        assert read_end_numbered(fd, len(data) * 2) == (1, data)
        # After a cut, counted with the lines the cut freed.
        assert cap_file(fd, len(data) // 2) > 0
        first, end = read_end_numbered(fd, len(data))
        assert end.startswith(b"line ") and first == int(end.split()[1]) == int(os.getxattr(fd, CUT_LINES_XATTR)) + 1
    finally:
        os.close(fd)
