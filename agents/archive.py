"""An agent's output kept after its sandbox is gone: one file per agent, bounded.

``<KICI_AGENT_LOG_DIR>/<agent id>/console.log`` holds the last :data:`ARCHIVE_BYTES` of what the
sandbox wrote (a container's stdout and stderr, a VM's serial console and VMM log, a bare-metal
process's output), saved by the backend right before it removes the sandbox. The finished agent's
console page shows its end and offers it for download; retention (``agents.retention``) deletes it
with the agent. ``shell.log`` beside it holds the transcripts of the shells opened into the sandbox.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from django.conf import settings

from consolelog.cap import CUT_LINES_XATTR, count_lines, line_number_at, numbering_lock
from consolelog.tail import read_lines_before

#: Bytes kept per agent (the end of its output).
ARCHIVE_BYTES = 8 * 1024 * 1024
#: Lines of the archive the console page shows.
SHOWN_LINES = 500


def archive_dir(agent_id: str) -> Path:
    """The agent's directory under ``KICI_AGENT_LOG_DIR``; raises ValueError for an id that is not
    a single path component (it names a directory)."""
    if not agent_id or "/" in agent_id or agent_id in (".", ".."):
        raise ValueError(f"agent id {agent_id!r} cannot name an archive directory")
    return Path(settings.KICI_AGENT_LOG_DIR) / agent_id


def archive_path(agent_id: str) -> Path:
    return archive_dir(agent_id) / "console.log"


def shell_transcript_path(agent_id: str) -> Path:
    """The transcripts of the shells opened into the agent's sandbox (``live.shell``), one session
    after another, kept beside its console archive and deleted with it."""
    return archive_dir(agent_id) / "shell.log"


def times_path(agent_id: str) -> Path:
    """The archive's line times: one ``first count ms`` run per line of text, by line number."""
    return archive_dir(agent_id) / "console.times"


def write_archive(
    agent_id: str, data: bytes, lines_before: int = 0, times: Iterable[tuple[int, int, int]] = ()
) -> Path:
    """Keep the last :data:`ARCHIVE_BYTES` of ``data`` as the agent's archive (written to a
    temporary file and renamed, so a reader never sees half of it). ``lines_before``: how many
    lines of the output came before ``data`` (a container's lines docker no longer held). The
    lines before the kept part, cut ones included, are recorded in the archive's
    ``consolelog.cap.CUT_LINES_XATTR``, as a cap of a live file records them, so its lines keep their
    numbers in the output (``archived_lines``). ``times``: the lines' times as the console showed
    them, runs ``(first line number, count, ms since the epoch)``, kept beside it
    (:func:`archived_times`). Returns its path; raises OSError when it cannot be written (a
    filesystem without user extended attributes, when lines were cut)."""
    path = archive_path(agent_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    cut = 0
    if len(data) > ARCHIVE_BYTES:
        end = data[-ARCHIVE_BYTES:]
        newline = end.find(b"\n")
        kept = end[newline + 1 :] if 0 <= newline < len(end) - 1 else end
        cut = count_lines(data[: len(data) - len(kept)])
        data = kept
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        if lines_before + cut:
            os.setxattr(out.fileno(), CUT_LINES_XATTR, str(lines_before + cut).encode())
    stamps = times_path(agent_id)
    runs = "".join(f"{first} {count} {ms}\n" for first, count, ms in times if count > 0 and ms > 0)
    if runs:
        pending = stamps.with_name(stamps.name + ".tmp")
        pending.write_text(runs)
        os.replace(pending, stamps)
    else:
        stamps.unlink(missing_ok=True)
    os.replace(tmp, path)
    return path


def archived_times(agent_id: str, first: int, stop: int) -> dict[int, int]:
    """``{line number: ms}`` of the archive's lines ``[first, stop)`` that have a kept time
    (:func:`write_archive`); empty when none were kept or the file cannot be read."""
    out: dict[int, int] = {}
    try:
        with open(times_path(agent_id), encoding="ascii") as runs:
            for run in runs:
                start, count, ms = (int(part) for part in run.split())
                if start >= stop:
                    break
                for number in range(max(start, first), min(start + count, stop)):
                    out[number] = ms
    except (OSError, ValueError):
        return {}
    return out


def archive_parts(
    agent_id: str, parts: list[tuple[str, bytes]], times: list[dict[int, int]] | None = None
) -> Path | None:
    """Keep several outputs of one sandbox as its archive, each under a ``--- <title> ---`` line,
    the last part's end kept when they exceed :data:`ARCHIVE_BYTES` (the archive's lines are
    numbered by their place in it). ``times``: per part, the times of its lines by their index in
    it (0: its first line; ``consolelog.times.end_with_times``), kept as :func:`write_archive`
    keeps them. None when ``parts`` is empty; raises OSError when it cannot be written."""
    if not parts:
        return None
    data = b""
    runs: list[tuple[int, int, int]] = []
    for index, (title, part) in enumerate(parts):
        data += f"--- {title} ---\n".encode()
        base = count_lines(data) + 1  # the number of the part's first line in the archive
        for offset, ms in sorted((times[index] if times and index < len(times) else {}).items()):
            if runs and runs[-1][2] == ms and runs[-1][0] + runs[-1][1] == base + offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, ms)
            else:
                runs.append((base + offset, 1, ms))
        data += part
    return write_archive(agent_id, data, times=runs)


class Archived(NamedTuple):
    """Lines of an archive: ``lines[0]`` is line ``first`` of the output; ``oldest`` is the number
    of the archive's first line."""

    oldest: int
    first: int
    lines: list[str]


def archived_lines(agent_id: str, limit: int = SHOWN_LINES, before: int | None = None) -> Archived | None:
    """Up to ``limit`` lines of the agent's archive numbered below ``before`` (None: its last
    lines), numbered by their place in the output (lines cut from its front counted, see
    :func:`write_archive`; empty lines skipped and capped like every console line,
    ``consolelog.tail.read_lines_before``), or None when it has none. ``first`` is ``before`` when no
    line is there; ``oldest`` the number of its first line."""
    try:
        fd = os.open(archive_path(agent_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if before is None:
            with numbering_lock(fd):
                before = line_number_at(fd, os.fstat(fd).st_size)
        oldest, first, lines = read_lines_before(fd, before, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
    return Archived(oldest, first, lines)


def delete_archives(agent_ids) -> None:
    """Remove what is kept of ``agent_ids``' output: their archives and a bare-metal process's
    ``<agent id>.log`` beside them (missing ones are fine)."""
    for agent_id in agent_ids:
        try:
            directory = archive_dir(agent_id)
        except ValueError:
            continue
        shutil.rmtree(directory, ignore_errors=True)
        directory.with_name(f"{agent_id}.log").unlink(missing_ok=True)
