"""The output cap on real files, against real writer processes that append fast."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from consolelog.cap import cap_file, data_start, read_end
from consolelog.tail import FileTail, SkipMarker

CAP = 256 * 1024
LINE = "line {:08d} " + "x" * 50 + "\n"
LEN = len(LINE.format(0))  # bytes of one line

# A writer that prints numbered lines as fast as it can through the descriptor it is given:
# O_APPEND (a serial console, a process's output) or not (firecracker's VMM log writes at its
# own offset). It stops after COUNT lines.
WRITER = r"""
import os, sys
fd, count = int(sys.argv[1]), int(sys.argv[2])
line = "line {:08d} " + "x" * 50 + "\n"
batch = []
for i in range(count):
    batch.append(line.format(i))
    if len(batch) == 64:
        os.write(fd, "".join(batch).encode())
        batch = []
if batch:
    os.write(fd, "".join(batch).encode())
"""


def start_writer(path, count: int, append: bool) -> subprocess.Popen:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
    fd = os.open(path, flags, 0o644)
    try:
        return subprocess.Popen([sys.executable, "-c", WRITER, str(fd), str(count)], pass_fds=(fd,))
    finally:
        os.close(fd)


def allocated(fd: int) -> int:
    return os.fstat(fd).st_blocks * 512


def numbers(lines) -> list[int]:
    out = []
    for line in lines:
        assert line.startswith("line ") and len(line) == LEN - 1, line
        out.append(int(line.split()[1]))
    return out


@pytest.mark.parametrize("append", [True, False], ids=["o-append", "own-offset"])
def test_a_chatty_writer_is_held_to_the_cap_after_every_round_and_the_kept_end_is_whole_lines(tmp_path, append):
    path = tmp_path / "serial-console.log"
    count = 200_000  # 12.8 MB, 50 times the cap
    writer = start_writer(path, count, append)
    fd = os.open(path, os.O_RDWR)
    block = os.fstat(fd).st_blksize
    rounds = 0
    try:
        while writer.poll() is None:
            if cap_file(fd, CAP):
                rounds += 1
                # Right after a round only the kept half (plus the block the cut is in) has storage,
                # whatever the writer added meanwhile.
                assert allocated(fd) <= os.fstat(fd).st_size - data_start(fd) + 2 * block
            time.sleep(0.005)
        assert writer.wait() == 0
        cap_file(fd, CAP)
        size = os.fstat(fd).st_size
        assert size == count * LEN  # the size still counts everything written
        # After a round a file holds at most the cap: more is cut to its last half.
        assert allocated(fd) <= CAP + 2 * block
        assert rounds >= 1
        kept = read_end(fd, size)
        assert CAP // 2 - LEN <= len(kept) <= CAP
        assert numbers(kept.decode().splitlines()) == list(range(count - len(kept) // LEN, count))
    finally:
        os.close(fd)
        if writer.poll() is None:
            writer.kill()


def test_a_cap_cuts_at_a_line_start_and_leaves_a_file_under_it_alone(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"".join(LINE.format(i).encode() for i in range(8192)))  # 512 KiB
    fd = os.open(path, os.O_RDWR)
    try:
        assert cap_file(fd, 1024 * 1024) == 0
        freed = cap_file(fd, CAP)
        assert freed % LEN == 0 and 0 < LEN * 8192 - freed <= CAP // 2
        assert read_end(fd, 10**9).startswith(LINE.format(freed // LEN).encode())
        # A read starting inside the freed range gets the kept lines only, never NUL bytes.
        assert read_end(fd, LEN * 8192 - freed + 1000) == read_end(fd, 10**9)
        with pytest.raises(ValueError, match="cap 1"):
            cap_file(fd, 1)
    finally:
        os.close(fd)


async def follow(path, stop, **kwargs) -> list[str]:
    tail = FileTail(path, poll_interval=0.01, create=False, **kwargs)
    lines: list[str] = []
    async for batch in tail.batches(stop):
        lines.extend(batch)
    return lines


@pytest.mark.parametrize("append", [True, False], ids=["o-append", "own-offset"])
def test_the_tail_follows_a_file_capped_under_it_without_losing_or_repeating_lines(tmp_path, append):
    path = tmp_path / "vmm.log"
    path.touch()
    count = 60_000

    async def main():
        stop = asyncio.Event()
        reader = asyncio.create_task(follow(path, stop))
        writer = start_writer(path, count, append)
        fd = os.open(path, os.O_RDWR)
        freed = 0
        try:
            while writer.poll() is None:
                freed += await asyncio.to_thread(cap_file, fd, CAP)
                await asyncio.sleep(0.005)
            freed += cap_file(fd, CAP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.path.getsize(path) > 0:
                await asyncio.sleep(0.05)
                if read_end(fd, 100).endswith(LINE.format(count - 1).encode()):
                    break
            await asyncio.sleep(0.2)
        finally:
            os.close(fd)
            stop.set()
        return await reader, freed

    lines, freed = asyncio.run(main())
    assert freed > 0
    marked = False
    # Every line whole, in order, none twice; a line is missing only where a marker says the tail
    # fell behind a cut (the writer is faster than the tail here), by no more than it says.
    expected, missing, skipped = 0, 0, 0
    for line in lines:
        if isinstance(line, SkipMarker):
            skipped += line.skipped
            marked = True
            continue
        (number,) = numbers([line])
        assert number == expected or (marked and number > expected), (number, expected)
        missing += number - expected
        expected, marked = number + 1, False
    assert expected == count
    assert missing * LEN <= skipped + LEN * sum(isinstance(line, SkipMarker) for line in lines)


def test_a_tail_that_starts_after_a_cap_steps_over_the_freed_range_to_a_whole_line(tmp_path):
    path = tmp_path / "serial-console.log"
    path.write_bytes(b"".join(LINE.format(i).encode() for i in range(8192)))
    fd = os.open(path, os.O_RDWR)
    try:
        freed = cap_file(fd, CAP)
    finally:
        os.close(fd)

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(follow(path, stop))
        await asyncio.sleep(0.3)
        stop.set()
        return await task

    lines = asyncio.run(main())
    assert isinstance(lines[0], SkipMarker) and lines[0].skipped == freed
    assert numbers(lines[1:]) == list(range(freed // LEN, 8192))
