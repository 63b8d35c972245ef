"""The transcript of a shell session (live.shell.Transcript): typed lines marked with who and when,
the terminal's own reports left out, output bounded."""

from __future__ import annotations

from datetime import UTC, datetime

from agents.archive import shell_transcript_path
from live.shell import Transcript

AT = datetime(2026, 12, 5, 14, 22, 1, tzinfo=UTC)


def _session(agent_id: str) -> Transcript:
    transcript = Transcript(agent_id, "alice")
    transcript.open("shell opened by alice")
    return transcript


def test_typed_lines_are_marked_with_who_and_when_without_the_terminals_reports():
    transcript = _session("scaler-container-7a000001")
    transcript.typed(b"ls\x1b[6;5R", AT)  # busybox asked where the cursor is; xterm answered
    transcript.typed(b" -l\r", AT)
    transcript.output(b"ls -l\r\ntotal 0\r\n")
    transcript.typed(b"echo a\r\necho \x1b[Ab\r", AT)  # pasted, and an arrow key
    transcript.typed(b"\r", AT)  # Enter alone marks nothing
    transcript.typed(b"exi", AT)  # not ended by Enter: marked at the close
    transcript.close("closed: the shell exited", AT)
    text = shell_transcript_path("scaler-container-7a000001").read_bytes().decode()
    mark = "[kici-shell input by alice at 2026-12-05T14:22:01Z] "
    assert text == (
        "\n=== shell opened by alice ===\n"
        f"\n{mark}ls -l\nls -l\r\ntotal 0\r\n"
        f"\n{mark}echo a\n\n{mark}echo \\x1b[Ab\n\n{mark}exi\n"
        "\n=== closed: the shell exited ===\n"
    )


def test_output_past_the_cap_is_counted_not_written_and_typed_lines_still_are(monkeypatch):
    monkeypatch.setattr("live.shell.TRANSCRIPT_MAX_BYTES", 100)
    transcript = _session("scaler-container-7a000002")
    transcript.output(b"x" * 60)
    transcript.output(b"y" * 60)  # past 100 bytes: left out
    transcript.typed(b"whoami\r", AT)
    transcript.close("closed", AT)
    text = shell_transcript_path("scaler-container-7a000002").read_bytes().decode()
    assert "x" * 60 in text and "yy" not in text
    assert "] whoami\n" in text
    assert text.endswith("=== closed; 60 B of output not recorded (the transcript keeps at most 100 B) ===\n")
