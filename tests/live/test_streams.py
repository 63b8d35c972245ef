"""Console fan-out core (live.streams, live.hub, live.sources): shared pump, ring, bounded
per-viewer buffers, sources."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from consolelog.dockerlogs import RedisCheckpoints
from consolelog.tail import LineNumber
from live.hub import ConsoleHub
from live.sources import docker_log_lines, docker_log_source, file_source
from live.streams import (
    LEVEL_DEBUG,
    LEVEL_DROPPED,
    LEVEL_ERROR,
    Line,
    StreamKey,
    ViewerBuffer,
    is_failure_line,
    split_batches,
)
from tests.support.docker import run_script

KEY = StreamKey("scaler-firecracker-0a1b2c3d", "serial")


def append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def drain(viewer, count: int, timeout: float = 5.0) -> list[Line]:
    """Collect rows from ``viewer`` until ``count`` stream lines (not drop rows) arrived."""
    rows: list[Line] = []
    async with asyncio.timeout(timeout):
        while sum(1 for r in rows if not r.dropped) < count:
            batch, _ = await viewer.next_batch()
            rows.extend(batch)
    return rows


async def wait_until(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@pytest.fixture
async def hub():
    hub = ConsoleHub(tick=0.2)
    yield hub
    await hub.aclose()


def source_for(path):
    return file_source(path, poll_interval=0.02)


# --- failure lines ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[    1.234] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)",
        "KERNEL PANIC",
        "Failed to execute /init (error -2)",
        "[FAILED] Failed to start Journal Service.",
        "systemd[1]: Failed to mount /sys/kernel/config.",
        "vfs: unable to mount root fs",
        "end Kernel panic - NOT SYNCING",
    ],
)
def test_it_recognises_a_failure_line(text):
    assert is_failure_line(text)


@pytest.mark.parametrize("text", ["Starting init", "systemd[2]: Failed", "failed to sync", ""])
def test_it_leaves_an_ordinary_line_alone(text):
    assert not is_failure_line(text)


# --- the per-viewer buffer ---------------------------------------------------------------------


def lines(first: int, count: int) -> list[Line]:
    return [Line(f"l{i}", i) for i in range(first, first + count)]


def test_an_overflowing_viewer_gets_one_drop_row_then_the_newest_lines():
    buf = ViewerBuffer(10)
    buf.push(lines(1, 25), gen=1)
    rows, reset = buf.pop_batch()
    assert not reset
    assert rows[0] == Line("… 16 lines dropped", 1, LEVEL_DROPPED, 16)
    assert [r.seq for r in rows[1:]] == list(range(17, 26))
    assert buf.dropped_total == 16


def test_drop_rows_merge_while_the_viewer_stays_behind():
    buf = ViewerBuffer(10)
    buf.push(lines(1, 12), gen=1)
    buf.push(lines(13, 5), gen=1)
    rows, _ = buf.pop_batch()
    assert len(rows) == 10 and rows[0].dropped == 8 and rows[0].text == "… 8 lines dropped"
    assert sum(1 for r in rows if r.dropped) == 1


def test_a_gap_in_sequence_numbers_becomes_a_drop_row():
    buf = ViewerBuffer(100)
    buf.push(lines(1, 3), gen=1)
    buf.push(lines(9, 2), gen=1)
    rows, _ = buf.pop_batch()
    assert [r.text for r in rows] == ["l1", "l2", "l3", "… 5 lines dropped", "l9", "l10"]
    assert buf.dropped_total == 5


def test_lines_already_seen_are_not_repeated():
    buf = ViewerBuffer(100)
    buf.start_after(1, 5)
    buf.push(lines(3, 5), gen=1)
    rows, _ = buf.pop_batch()
    assert [r.seq for r in rows] == [6, 7]


def test_a_new_generation_resets_the_view():
    buf = ViewerBuffer(100)
    buf.push(lines(1, 3), gen=1)
    buf.pop_batch()
    buf.push(lines(1, 2), gen=2)
    buf.push(lines(9, 1), gen=1)  # late batch of the old generation: ignored
    rows, reset = buf.pop_batch()
    assert reset and [r.seq for r in rows] == [1, 2]


def test_split_batches_respects_the_line_and_character_caps():
    texts = ["a" * 10] * 25 + ["b" * 100] + ["c"] * 3
    parts = split_batches(texts, max_lines=10, max_chars=50)
    assert [x for part in parts for x in part] == texts
    assert all(len(p) <= 10 and (sum(map(len, p)) <= 50 or len(p) == 1) for p in parts)


# --- the hub ---------------------------------------------------------------------------------------


async def test_two_viewers_share_one_pump_and_the_last_to_leave_stops_it(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    first = await hub.subscribe(KEY, source_for(path))
    second = await hub.subscribe(KEY, source_for(path))
    pump = hub.pump_task(KEY)
    assert pump is not None and not pump.done()
    assert hub.pumps_started == 1

    append(path, b"booting\n")
    assert [r.text for r in await drain(first, 1)] == ["booting"]
    assert [r.text for r in await drain(second, 1)] == ["booting"]

    await hub.unsubscribe(first)
    assert not pump.done()
    await hub.unsubscribe(second)
    assert pump.done()
    assert hub.pump_task(KEY) is None and hub.viewers(KEY) == 0


async def test_a_late_joiner_gets_the_last_500_lines_then_live_lines(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    early = await hub.subscribe(KEY, source_for(path))
    append(path, b"".join(b"line %d\n" % i for i in range(1, 801)))
    await drain(early, 800)

    late = await hub.subscribe(KEY, source_for(path))
    assert [r.text for r in late.snapshot] == [f"line {i}" for i in range(301, 801)]
    assert late.snapshot[-1].seq == 800
    append(path, b"after join\n")
    rows = await drain(late, 1)
    assert [(r.text, r.seq) for r in rows] == [("after join", 801)]
    assert hub.pumps_started == 1


async def test_a_slow_viewer_gets_a_drop_row_and_a_fast_one_loses_nothing(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    fast = await hub.subscribe(KEY, source_for(path))
    slow = await hub.subscribe(KEY, source_for(path))
    received: list[Line] = []

    async def read_fast():
        while True:
            batch, _ = await fast.next_batch()
            received.extend(batch)

    reader = asyncio.create_task(read_fast())
    for block in range(10):
        append(path, b"".join(b"row %d\n" % i for i in range(block * 500 + 1, block * 500 + 501)))
        await asyncio.sleep(0.03)
    await wait_until(lambda: len(received) >= 5000)
    reader.cancel()
    assert [r.seq for r in received] == list(range(1, 5001))
    assert not any(r.dropped for r in received)

    assert len(slow.buffer) == 2000  # bounded
    rows, _ = slow.buffer.pop_batch()
    assert rows[0].level == LEVEL_DROPPED and rows[0].text == "… 3001 lines dropped"
    assert [r.seq for r in rows[1:]] == list(range(3002, 5001))


async def test_serial_failure_lines_are_flagged(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    viewer = await hub.subscribe(KEY, source_for(path), flag_failures=True)
    append(path, b"ok\n[ 0.5] Kernel panic - not syncing: Attempted to kill init!\nafter\n")
    rows = await drain(viewer, 3)
    assert [r.level for r in rows] == [LEVEL_DEBUG, LEVEL_ERROR, LEVEL_DEBUG]


async def test_the_vmm_log_is_not_flagged(hub, tmp_path):
    path = tmp_path / "vmm.log"
    viewer = await hub.subscribe(StreamKey(KEY.agent_id, "vmm"), source_for(path))
    append(path, b"Kernel panic\n")
    (row,) = await drain(viewer, 1)
    assert row.level == LEVEL_DEBUG


async def test_a_tail_drop_marker_reaches_viewers_as_a_marker_row(hub):
    from consolelog.tail import DropMarker

    async def source():
        yield [DropMarker(42), "after the gap"]
        await asyncio.Event().wait()

    viewer = await hub.subscribe(KEY, source)
    rows = await drain(viewer, 2)
    assert [(r.text, r.level, r.seq) for r in rows] == [
        ("[dropped 42 lines]", LEVEL_DROPPED, 1),
        ("after the gap", LEVEL_DEBUG, 2),
    ]
    assert rows[0].dropped == 0  # a line of the stream, not a viewer drop row


async def test_the_pump_starts_over_with_a_new_generation_after_everyone_left(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    viewer = await hub.subscribe(KEY, source_for(path))
    append(path, b"one\n")
    await drain(viewer, 1)
    await hub.unsubscribe(viewer)

    again = await hub.subscribe(KEY, source_for(path))
    assert hub.pumps_started == 2
    rows = await drain(again, 1)
    assert [(r.text, r.seq) for r in again.snapshot + rows][-1] == ("one", 1)  # re-read, numbered afresh


async def test_a_file_source_starts_near_the_end_of_a_big_file(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    path.write_bytes(b"".join(b"old line %07d\n" % i for i in range(100_000)))  # 1.8 MB
    viewer = await hub.subscribe(KEY, file_source(path, backlog_bytes=200, poll_interval=0.02))
    rows = await drain(viewer, 1)
    await asyncio.sleep(0.1)
    rows += viewer.buffer.pop_batch()[0]
    assert rows[-1].text == "old line 0099999"
    assert len(rows) < 20 and all(r.text.startswith("old line ") and len(r.text) == 16 for r in rows)


async def test_a_pumps_lines_carry_their_numbers_in_the_file_and_their_receive_times(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    path.write_bytes(b"".join(b"old line %07d\n\n" % i for i in range(1, 100_001)))  # empty lines: not counted
    viewer = await hub.subscribe(KEY, file_source(path, backlog_bytes=2000, poll_interval=0.02))
    rows = await drain(viewer, 1)
    assert rows[-1].seq == 100_000 and all(r.text == f"old line {r.seq:07d}" for r in rows)
    assert all(r.ts == 0 for r in rows)  # in the file before the pump started: time unknown
    before = time.time()
    append(path, b"new line\n")
    rows = await drain(viewer, 1)
    assert [(r.text, r.seq) for r in rows] == [("new line", 100_001)]
    assert before <= rows[0].ts <= time.time()
    received = rows[0].ts
    await hub.unsubscribe(viewer)

    again = await hub.subscribe(KEY, file_source(path, backlog_bytes=2000, poll_interval=0.02))
    rows = await drain(again, 1)
    assert rows[-1].seq == 100_001  # a new pump numbers as the first did
    assert rows[-1].ts == round(received * 1000) / 1000  # and knows when the first received it
    assert all(r.ts == 0 for r in rows[:-1])  # lines no pump received live
    times = list(hub.transport.times[KEY])
    assert len(times) == 1 and times[0].startswith("100001:1:")  # only the line received live


async def test_a_source_that_fails_is_reported_to_the_viewers(hub, tmp_path):
    path = tmp_path / "serial-console.log"
    path.mkdir()  # a directory where the log should be: reading it fails
    viewer = await hub.subscribe(KEY, source_for(path))
    (row,) = await drain(viewer, 1)
    assert row.level == LEVEL_ERROR and row.text.startswith("[console source failed:")


async def test_a_missing_console_file_is_waited_for_not_created(hub, tmp_path):
    path = tmp_path / "vm" / "serial-console.log"
    viewer = await hub.subscribe(KEY, source_for(path))
    await asyncio.sleep(0.1)
    assert not path.parent.exists()  # viewing creates nothing
    path.parent.mkdir()
    path.write_bytes(b"first boot line\n")
    rows = await drain(viewer, 1)
    assert [r.text for r in rows] == ["first boot line"]


def test_it_refuses_a_bad_stream_key():
    with pytest.raises(ValueError, match="agent_id"):
        StreamKey("../etc", "serial")
    with pytest.raises(ValueError, match="stream"):
        StreamKey("scaler-x", "a b")


# --- docker logs ----------------------------------------------------------------------------------


@pytest.fixture
def checkpoints():
    """The line checkpoints of a container console of its own (``consolelog.dockerlogs``)."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    marks = RedisCheckpoints(client, f"tail-logs-{uuid.uuid4().hex[:8]}")
    yield marks
    client.delete(marks.marks, marks.top_key)
    client.close()


async def _followed_lines(docker_client, image: str, script: str, checkpoints, **kwargs) -> list[str]:
    """Every line ``docker_log_lines`` yields for a container running ``sh -c script`` to its end."""
    container = run_script(docker_client, image, script, "tail-logs")
    try:
        got = []
        async with asyncio.timeout(20):
            async for line in docker_log_lines(container, checkpoints, **kwargs):
                got.append(line.text)
        return got
    finally:
        container.remove(force=True)


@pytest.mark.docker
async def test_docker_logs_are_followed_with_the_same_line_cap(docker_client, agent_image, checkpoints):
    script = (
        "echo first; echo err line >&2; "
        "head -c 70000 /dev/zero | tr '\\0' x; echo; "
        "printf 'caf\\303\\251\\n'; sleep 0.3; echo last"
    )
    got = await _followed_lines(docker_client, agent_image, script, checkpoints)
    # Each stream keeps its own order and lines; the two streams interleave freely.
    assert got.count("err line") == 1
    stdout = [line for line in got if line != "err line"]
    assert stdout == ["first", "x" * 65536 + " [truncated]", "café", "last"]


@pytest.mark.docker
async def test_a_stderr_line_is_never_spliced_into_an_open_stdout_line(docker_client, agent_image, checkpoints):
    # Docker logs a line longer than 16 KiB in parts, so the stderr line lands between two parts
    # of the open stdout line; read through one splitter, the two became one line.
    script = (
        "head -c 20000 /dev/zero | tr '\\0' x; sleep 0.5; echo err line >&2; sleep 0.5; "
        "head -c 100 /dev/zero | tr '\\0' y; echo"
    )
    got = await _followed_lines(docker_client, agent_image, script, checkpoints)
    assert sorted(got) == sorted(["err line", "x" * 20000 + "y" * 100])


@pytest.mark.docker
async def test_a_container_flooding_a_slow_reader_loses_its_oldest_lines_to_a_jump_in_numbers(
    docker_client, agent_image, checkpoints
):
    script = "sleep 0.5; i=1; while [ $i -le 3000 ]; do echo line $i; i=$((i+1)); done; sleep 60"
    container = run_script(docker_client, agent_image, script, "tail-logs")
    try:
        got = []
        source = docker_log_source(container, checkpoints, max_queued=100)
        async with asyncio.timeout(20), contextlib.aclosing(source):
            async for batch in source:
                assert isinstance(batch[0], LineNumber)  # each batch says where it starts
                assert [line.n for line in batch[1:]] == list(range(batch[0].number, batch[0].number + len(batch) - 1))
                got.extend(batch[1:])
                if got[-1].n == 3000:
                    break
                await asyncio.sleep(0.2)  # slower than the container
    finally:
        container.remove(force=True)
    assert len(got) < 3000 and all(line.text == f"line {line.n}" for line in got)  # numbers jump over the drops
