"""consolelog.dockerlogs without a docker daemon: timestamps, the line count over docker's messages, keys."""

from __future__ import annotations

import pytest

from consolelog.dockerlogs import CHECKPOINT_LINES, STDERR, STDOUT, Checkpoint, Numberer, checkpoint_keys, stamp_ns
from live.streams import StreamKey
from live.transport import stream_key_name


def test_a_docker_timestamp_reads_to_the_nanosecond():
    assert stamp_ns(b"1970-01-01T00:00:01.000000002Z") == 1_000_000_002
    assert stamp_ns("2026-12-01T18:59:55.5Z") - stamp_ns("2026-12-01T18:59:55Z") == 500_000_000


@pytest.mark.parametrize("stamp", [b"", b"2026-12-01T18:59:55.1+01:00", b"yesterday"])
def test_a_timestamp_that_is_not_rfc3339_in_utc_is_refused_by_name(stamp):
    with pytest.raises(ValueError, match="docker log timestamp"):
        stamp_ns(stamp)


def stamp(n: int) -> bytes:
    return b"2026-12-01T18:59:55.%09dZ" % n


def test_each_stream_has_its_own_splitter_and_a_line_is_numbered_when_it_ends():
    numberer = Numberer(10)
    assert numberer.feed(STDOUT, stamp(1), b"x" * 5) == []  # a part of a long line
    (err,) = numberer.feed(STDERR, stamp(2), b"err\n")
    (out,) = numberer.feed(STDOUT, stamp(3), b"yy\n")
    assert (err.n, err.text) == (10, "err") and (out.n, out.text) == (11, "xxxxxyy")
    assert out.ms == stamp_ns(stamp(1)) // 1_000_000  # the time of its first part
    assert numberer.feed(STDOUT, stamp(4), b"\n") == [] and numberer.next == 12  # empty: not counted


def test_a_checkpoint_waits_for_a_message_where_no_line_is_open():
    numberer = Numberer(1, checkpoint_first=True)
    numberer.feed(STDOUT, stamp(0), b"first\n")
    for i in range(1, CHECKPOINT_LINES - 1):
        numberer.feed(STDOUT, stamp(i), b"line\n")
    numberer.feed(STDERR, stamp(5000), b"open")  # a stderr line begins and stays open
    numberer.feed(STDOUT, stamp(5001), b"out\n")  # line 1000: a checkpoint is due
    numberer.feed(STDOUT, stamp(5002), b"more\n")  # not here: the stderr line is open
    numberer.feed(STDERR, stamp(5003), b" closed\n")  # line 1002
    numberer.feed(STDOUT, stamp(5004), b"next\n")  # here
    assert numberer.new_checkpoints == [
        Checkpoint(1, STDOUT, stamp(0).decode()),
        Checkpoint(1003, STDOUT, stamp(5004).decode()),
    ]
    assert Checkpoint.parse(numberer.new_checkpoints[1].member()) == numberer.new_checkpoints[1]


@pytest.mark.parametrize("what", ["marks", "top"])
def test_the_checkpoints_live_in_the_console_streams_key_space(what):
    marks, top = checkpoint_keys("scaler-container-c0a50001")
    expected = stream_key_name(StreamKey("scaler-container-c0a50001", "console"), what)
    assert {"marks": marks, "top": top}[what] == expected
