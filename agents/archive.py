"""An agent's output kept after its sandbox is gone: one file per agent, bounded.

``<KICI_AGENT_LOG_DIR>/<agent id>/console.log`` holds the last :data:`ARCHIVE_BYTES` of what the
sandbox wrote (a container's stdout and stderr, a VM's serial console and VMM log, a bare-metal
process's output), saved by the backend right before it removes the sandbox. The finished agent's
console page shows its end and offers it for download; retention (``agents.retention``) deletes it
with the agent.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from django.conf import settings

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


def write_archive(agent_id: str, data: bytes) -> Path:
    """Keep the last :data:`ARCHIVE_BYTES` of ``data`` as the agent's archive (written to a
    temporary file and renamed, so a reader never sees half of it). Returns its path; raises
    OSError when it cannot be written."""
    path = archive_path(agent_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(data) > ARCHIVE_BYTES:
        cut = data[-ARCHIVE_BYTES:]
        newline = cut.find(b"\n")
        data = cut[newline + 1 :] if 0 <= newline < len(cut) - 1 else cut
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
    return path


def archive_parts(agent_id: str, parts: list[tuple[str, bytes]]) -> Path | None:
    """Keep several outputs of one sandbox as its archive, each under a ``--- <title> ---`` line,
    the last part's end kept when they exceed :data:`ARCHIVE_BYTES`. None when ``parts`` is empty;
    raises OSError when it cannot be written."""
    if not parts:
        return None
    return write_archive(agent_id, b"".join(f"--- {title} ---\n".encode() + data for title, data in parts))


def archived_lines(agent_id: str, limit: int = SHOWN_LINES) -> list[str] | None:
    """The last ``limit`` lines of the agent's archive (UTF-8, undecodable bytes replaced), or None
    when it has none."""
    try:
        path = archive_path(agent_id)
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 256 * 1024))
            tail = f.read()
    except (OSError, ValueError):
        return None
    lines = tail.decode("utf-8", "replace").splitlines()
    if size > len(tail) and lines:
        lines = lines[1:]  # read from the middle of a line
    return lines[-limit:]


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
