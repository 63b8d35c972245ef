"""The bounded file tail, on real files."""

from __future__ import annotations

import asyncio
import os

import pytest

from consolelog.tail import (
    MAX_LINE_BYTES,
    MAX_QUEUED_LINES,
    MAX_READ_BYTES,
    DropMarker,
    FileTail,
    LineQueue,
    LineSplitter,
    SkipMarker,
    tail_file,
)

POLL = 0.02  # tests poll faster than the default 100 ms to stay quick


def append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


class Tail:
    """Runs ``tail_file`` in a task that collects every yielded line."""

    def __init__(self, path, **kwargs):
        self.stop = asyncio.Event()
        self.lines: list[str] = []
        self.finished = asyncio.Event()
        self.task = asyncio.create_task(self._run(path, kwargs))

    async def _run(self, path, kwargs):
        try:
            async for line in tail_file(
                path, stop=self.stop, poll_interval=kwargs.pop("poll_interval", POLL), **kwargs
            ):
                self.lines.append(line)
        finally:
            self.finished.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[str]:
        async with asyncio.timeout(timeout):
            while len(self.lines) < count:
                await asyncio.sleep(0.005)
        return self.lines

    async def abort(self, timeout: float = 5.0) -> list[str]:
        self.stop.set()
        async with asyncio.timeout(timeout):
            await self.task
        return self.lines


async def started(path, **kwargs) -> Tail:
    tail = Tail(path, **kwargs)
    async with asyncio.timeout(2):
        while not os.path.exists(path):
            await asyncio.sleep(0.005)
    await asyncio.sleep(POLL * 2)  # the first look at the (empty) file has happened
    return tail


async def run_reader(tail: FileTail, until_offset: int) -> asyncio.Event:
    """Run the reader alone (no consumer) until it has consumed ``until_offset`` bytes."""
    stop = asyncio.Event()
    task = asyncio.create_task(tail.run(stop))
    async with asyncio.timeout(10):
        while tail.offset < until_offset:
            await asyncio.sleep(0.005)
    stop.set()
    await task
    return stop


# --- lines, aborts, truncation, decoding ------------------------------------------------------


async def test_it_yields_appended_lines_in_order(tmp_path):
    path = tmp_path / "serial-console.log"
    path.write_bytes(b"")
    tail = await started(path)
    append(path, b"line one\nline two\nline three\n")
    assert await tail.wait_for(3) == ["line one", "line two", "line three"]
    await tail.abort()


async def test_it_joins_a_line_written_in_two_parts(tmp_path):
    path = tmp_path / "serial-console.log"
    tail = await started(path)
    append(path, b"partial ")
    await asyncio.sleep(POLL * 3)
    assert tail.lines == []
    append(path, b"complete\nsecond line\n")
    assert await tail.wait_for(2) == ["partial complete", "second line"]
    await tail.abort()


async def test_it_skips_empty_lines(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"first\n\n\nsecond\n")
    await tail.wait_for(2)
    assert await tail.abort() == ["first", "second"]


async def test_it_ends_after_abort_with_what_was_read(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"before abort\n")
    await tail.wait_for(1)
    assert await tail.abort() == ["before abort"]
    assert tail.task.done()


async def test_it_flushes_the_partial_line_on_abort(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"complete line\nno trailing newline")
    await tail.wait_for(1)
    await asyncio.sleep(POLL * 3)
    assert await tail.abort() == ["complete line", "no trailing newline"]


async def test_it_creates_a_missing_file_and_follows_it(tmp_path):
    path = tmp_path / "vmm.log"
    assert not path.exists()
    tail = await started(path)
    assert path.exists() and path.stat().st_size == 0
    append(path, b"hello\n")
    assert await tail.wait_for(1) == ["hello"]
    await tail.abort()


async def test_it_refuses_a_path_whose_directory_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        async for _ in tail_file(tmp_path / "nope" / "log", stop=asyncio.Event()):
            pass


async def test_it_truncates_an_over_long_complete_line(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"x" * 70_000 + b"\n")
    (line,) = await tail.wait_for(1)
    assert line == "x" * MAX_LINE_BYTES + " [truncated]"
    assert await tail.abort() == [line]


async def test_it_discards_the_rest_of_an_over_long_partial_line(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"x" * 70_000)
    (line,) = await tail.wait_for(1)  # emitted before any newline arrives
    assert line == "x" * MAX_LINE_BYTES + " [truncated]"
    append(path, b"yz\nnext\n")
    assert await tail.wait_for(2) == [line, "next"]
    assert await tail.abort() == [line, "next"]


async def test_it_keeps_a_cumulative_drop_marker_at_the_head(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1, 10_006)))  # one read, no consumer
    tail = FileTail(path, poll_interval=POLL)
    stop = asyncio.Event()
    task = asyncio.create_task(tail.run(stop))
    async with asyncio.timeout(5):
        while tail.offset < path.stat().st_size:
            await asyncio.sleep(0.005)
    queued = tail.queue.snapshot()
    assert tail.reads == 1
    assert len(queued) == MAX_QUEUED_LINES
    assert queued[0] == DropMarker(6) and queued[0].text == "[dropped 6 lines]"
    assert queued[1:3] == ["line 7", "line 8"]

    append(path, b"line 10006\nline 10007\nline 10008\n")  # three more in one read
    async with asyncio.timeout(5):
        while tail.offset < path.stat().st_size:
            await asyncio.sleep(0.005)
    stop.set()
    await task
    queued = tail.queue.snapshot()
    assert len(queued) == MAX_QUEUED_LINES
    assert queued[0] == DropMarker(9)
    assert queued[1:] == [f"line {i}" for i in range(10, 10_009)]
    assert sum(1 for entry in queued if isinstance(entry, DropMarker)) == 1


async def test_it_decodes_a_character_straddling_a_read_boundary(tmp_path):
    path = tmp_path / "log"
    filler = b"a" * 99 + b"\n"
    body = filler * ((MAX_READ_BYTES - 200) // len(filler))
    body += b"b" * (MAX_READ_BYTES - 1 - len(body) - 5) + b"\n" + b"abcd"
    assert len(body) == MAX_READ_BYTES - 1
    body += "€ end\n".encode()  # the 3-byte euro sign starts at the last byte of the first read
    path.write_bytes(body)
    tail = await started(path)
    lines = await tail.wait_for(body.count(b"\n"))
    await tail.abort()
    assert lines[-1] == "abcd€ end"
    assert not any("\ufffd" in line for line in lines)


async def test_it_drains_a_burst_without_waiting_for_the_next_poll(tmp_path):
    path = tmp_path / "log"
    line = b"z" * 1023 + b"\n"
    path.write_bytes(line * (3 * 1024 + 512))  # 3.5 MiB: four slices
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tail = FileTail(path, poll_interval=5.0)  # a wait between slices would take 5 s
    stop = asyncio.Event()
    got = 0
    async with asyncio.timeout(3):
        async for batch in tail.batches(stop):
            got += len(batch)
            if got == 3 * 1024 + 512:
                stop.set()
    assert tail.reads >= 3
    assert loop.time() - t0 < 3
    assert got == 3 * 1024 + 512


# --- bursts, bad input, truncated and replaced files ---------------------------------------------


async def test_a_5_mib_line_without_newline_becomes_one_truncated_line_in_bounded_memory(tmp_path):
    path = tmp_path / "log"
    with open(path, "wb") as f:
        for _ in range(5):
            f.write(b"y" * MAX_READ_BYTES)
    tail = FileTail(path, poll_interval=POLL)
    await run_reader(tail, 5 * MAX_READ_BYTES)
    assert tail.reads == 5
    assert tail.queue.snapshot() == ["y" * MAX_LINE_BYTES + " [truncated]"]
    assert tail.splitter.peak_partial <= MAX_LINE_BYTES
    assert tail.splitter.partial == "" and tail.splitter.skipping


async def test_a_100000_line_burst_keeps_10000_with_one_marker(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"burst line %06d\n" % i for i in range(100_000)))
    tail = FileTail(path, poll_interval=POLL)
    await run_reader(tail, path.stat().st_size)
    queued = tail.queue.snapshot()
    assert len(queued) == MAX_QUEUED_LINES
    markers = [entry for entry in queued if isinstance(entry, DropMarker)]
    assert markers == [DropMarker(90001)] and queued[0] is markers[0]
    assert queued[1] == "burst line 090001" and queued[-1] == "burst line 099999"


async def test_a_fast_consumer_loses_nothing_from_a_100000_line_burst(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"burst line %06d\n" % i for i in range(100_000)))
    tail = await started(path)
    lines = await tail.wait_for(100_000)
    await tail.abort()
    assert len(lines) == 100_000 and lines[-1] == "burst line 099999"
    assert not any(isinstance(line, DropMarker) for line in lines)


async def test_it_replaces_invalid_utf8_instead_of_failing(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"ok \xff\xfe bad\n\xc3\x28 also\nfine\n")
    assert await tail.wait_for(3) == ["ok \ufffd\ufffd bad", "\ufffd( also", "fine"]
    await tail.abort()


async def test_it_joins_a_multibyte_character_split_across_two_writes(tmp_path):
    path = tmp_path / "log"
    tail = FileTail(path, poll_interval=POLL)
    stop = asyncio.Event()
    lines = []

    async def consume():
        async for batch in tail.batches(stop):
            lines.extend(batch)

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(POLL * 2)
    append(path, b"caf\xc3")
    async with asyncio.timeout(2):
        while tail.reads < 1:
            await asyncio.sleep(0.005)
    append(path, b"\xa9 au lait\n")
    async with asyncio.timeout(2):
        while not lines:
            await asyncio.sleep(0.005)
    stop.set()
    await consumer
    assert tail.reads == 2
    assert lines == ["café au lait"]


async def test_it_follows_a_truncated_file_from_its_start(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"old one\nold two\n")
    await tail.wait_for(2)
    path.write_bytes(b"new\n")  # truncate + write: shorter than the read offset
    assert await tail.wait_for(3) == ["old one", "old two", "new"]
    assert await tail.abort() == ["old one", "old two", "new"]


async def test_it_follows_a_replaced_file_after_draining_the_old_one(tmp_path):
    path = tmp_path / "log"
    tail = await started(path)
    append(path, b"first file\n")
    await tail.wait_for(1)
    with open(path, "ab") as old:
        os.rename(path, tmp_path / "log.1")
        old.write(b"late write to the old file\nold partial")  # writer still holds the old file
    path.write_bytes(b"second file line one which is long enough to be bigger\n")
    lines = await tail.wait_for(4)
    assert lines == [
        "first file",
        "late write to the old file",
        "old partial",
        "second file line one which is long enough to be bigger",
    ]
    append(path, b"more\n")
    assert (await tail.wait_for(5))[-1] == "more"
    await tail.abort()


async def test_it_starts_at_the_end_when_asked(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"history\n")
    tail = await started(path, from_start=False)
    append(path, b"fresh\n")
    assert await tail.wait_for(1) == ["fresh"]
    assert await tail.abort() == ["fresh"]


async def test_it_resumes_at_a_line_boundary_from_an_offset(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"alpha\nbravo\ncharlie\n")
    for offset, expected in ((6, ["bravo", "charlie"]), (8, ["charlie"])):
        tail = FileTail(path, poll_interval=POLL, start_offset=offset)
        stop = asyncio.Event()
        got = []
        async for batch in tail.batches(stop):
            got.extend(batch)
            stop.set()
        assert got == expected


# --- the building blocks ------------------------------------------------------------------------


def test_a_guest_line_that_looks_like_a_marker_is_counted_not_replaced():
    queue = LineQueue(4)
    queue.extend(["[dropped 99 lines]", "a", "b", "c", "d"])
    assert queue.snapshot() == [DropMarker(2), "b", "c", "d"]
    queue.extend(["e"])
    assert queue.snapshot() == [DropMarker(3), "c", "d", "e"]
    assert queue.take(2) == [DropMarker(3), "c"]
    queue.extend(["f", "g", "h"])
    assert queue.snapshot() == [DropMarker(5), "f", "g", "h"]


def test_the_splitter_holds_no_more_than_the_cap_whatever_the_chunking():
    splitter = LineSplitter(10)
    out = []
    for chunk in [b"abc", b"defghij", b"klm", b"nop\nq", b"r\n", b"\n", b"0123456789\n"]:
        out += splitter.feed(chunk)
        assert len(splitter.partial) <= 10
    assert out == ["abcdefghij [truncated]", "qr", "0123456789"]
    assert splitter.peak_partial <= 10


def test_the_splitter_flushes_an_incomplete_character_as_a_replacement():
    splitter = LineSplitter()
    assert splitter.feed(b"end \xe2\x82") == []
    assert splitter.flush() == ["end \ufffd"]


# --- paced mode (the console pump's source) ----------------------------------------------------


async def test_a_paced_tail_waits_for_a_slow_consumer_instead_of_dropping(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"paced line %06d\n" % i for i in range(100_000)))
    tail = FileTail(path, poll_interval=POLL, pace=True)
    stop = asyncio.Event()
    got, peak = [], 0
    async for batch in tail.batches(stop):
        peak = max(peak, len(batch) + len(tail.queue))
        got.extend(batch)
        await asyncio.sleep(0.002)  # slower than the disk
        if len(got) >= 100_000:
            stop.set()
    assert got == [f"paced line {i:06d}" for i in range(100_000)]
    assert tail.queue.dropped == 0 and peak <= MAX_QUEUED_LINES
    assert not any(isinstance(line, (DropMarker, SkipMarker)) for line in got)


async def test_a_paced_tail_skips_ahead_when_it_falls_too_far_behind(tmp_path):
    path = tmp_path / "log"
    line = b"f" * 99 + b"\n"
    path.write_bytes(line * (12 * 1024 * 1024 // 100))  # 12 MiB behind from the start
    tail = FileTail(path, poll_interval=POLL, pace=True, max_lag_bytes=4 * MAX_READ_BYTES)
    stop = asyncio.Event()
    got = []
    async for batch in tail.batches(stop):
        got.extend(batch)
        if tail.offset >= path.stat().st_size and not tail.queue:
            stop.set()
    skipped = path.stat().st_size - 2 * MAX_READ_BYTES
    assert got[0] == SkipMarker(skipped) and tail.skipped_bytes == skipped
    assert len(got) - 1 <= 2 * MAX_READ_BYTES // 100 and set(got[1:]) == {"f" * 99}


def test_max_lag_needs_pacing_and_room_for_two_reads(tmp_path):
    with pytest.raises(ValueError, match="max_lag_bytes"):
        FileTail(tmp_path / "log", max_lag_bytes=8 * MAX_READ_BYTES)
    with pytest.raises(ValueError, match="max_lag_bytes"):
        FileTail(tmp_path / "log", pace=True, max_lag_bytes=MAX_READ_BYTES)
