"""An approver's shell into a running or held container agent: who may open one
(:func:`shell_refusal`), the ``docker exec`` with a TTY behind it (:class:`ContainerShell`, which
ends the shell's processes itself since docker does not end an exec when its client goes away),
and its transcript in the agent's ``shell.log`` (:class:`Transcript`). How it works: docs/shell.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from datetime import UTC, datetime

import docker.errors
import requests

from agents.archive import ARCHIVE_BYTES, shell_transcript_path
from agents.choices import AgentState
from agents.models import Agent
from lib.units import format_bytes_iec
from operations.services import APPROVE_PERM
from scalers.backends.runtime import docker_client_for, runtime_for_scaler

from .consoles import runs_in_container

log = logging.getLogger(__name__)

#: The permission a shell needs: the one that approves operations (``operations.services``).
SHELL_PERM = APPROVE_PERM
#: States of an agent a shell opens into, and stays open in.
SHELL_STATES = (AgentState.RUNNING, AgentState.HELD)

#: The shell: bash when the image has it, else sh; it first announces its pid (:data:`PID_MARK`).
SHELL_COMMAND = [
    "/bin/sh",
    "-c",
    'printf "\\033]kici-shell;pid=%s\\007" "$$"; if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh',
]
#: The shell's pid in the container, as its first output (an OSC sequence a terminal ignores).
PID_MARK = re.compile(rb"\x1b\]kici-shell;pid=(\d+)\x07")
#: Output bytes looked through for :data:`PID_MARK` before giving up on it.
PID_MARK_WINDOW = 4096
#: Ends every process of the shell's session (``{sid}``) with signal ``{signal}``: ``/proc`` read
#: with the shell alone, since an image may have neither ``pkill`` nor a ``kill`` of process groups.
KILL_SESSION = (
    'for d in /proc/[0-9]*; do s=$(cat "$d/stat" 2>/dev/null) || continue; s=${{s##*) }}; set -- $s; '
    '[ "$4" = "{sid}" ] && kill -{signal} "${{d#/proc/}}" 2>/dev/null; done; true'
)

#: The terminal's answers to a program's queries, which reach the shell as input but nobody typed:
#: cursor position (``ESC [ row ; col R``, busybox's prompt asks), device attributes, focus.
TERMINAL_REPORTS = re.compile(rb"\x1b\[\??[\d;]*[Rc]|\x1b\[[IO]")
#: Bytes read from the exec at once (one frame to the browser at most).
READ_BYTES = 64 * 1024
#: Bytes a transcript file holds at most; output beyond is counted, not written.
TRANSCRIPT_MAX_BYTES = ARCHIVE_BYTES
#: Characters of one typed line kept in a transcript (a longer line is written in parts).
INPUT_LINE_MAX = 4096


def may_open_shells(user) -> bool:
    """Whether ``user`` is an active approver (:data:`SHELL_PERM`)."""
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm(SHELL_PERM))


def shell_refusal(user, agent: Agent | None) -> str | None:
    """Why ``user`` may not open a shell into ``agent`` (one sentence naming it), or None."""
    if not may_open_shells(user):
        return "a shell is for approvers: you lack the permission to approve operations"
    if agent is None:
        return "no such agent"
    if agent.state not in SHELL_STATES:
        return f"agent {agent.agent_id} is {agent.state}: a shell opens only into a running or held agent"
    if not runs_in_container(agent):
        return (
            f"agent {agent.agent_id} is a {agent.scaler.type} agent: the shell needs a container agent "
            "(its sandbox is entered with docker exec)"
        )
    return None


class ContainerShell:
    """One interactive ``docker exec`` into an agent's container (module doc). Make it with
    :meth:`open` (blocking: call it in a thread)."""

    def __init__(self, client, container_id: str, exec_id: str, stream) -> None:
        self.client = client
        self.container_id = container_id
        self.exec_id = exec_id
        self._stream = stream  # the SDK's socket wrapper; the socket lives as long as it does
        self.sock = getattr(stream, "_sock", stream)
        self.sock.setblocking(False)
        self.pid: str | None = None
        self._head = b""  # output held back while looking for PID_MARK
        self._closed = False

    @classmethod
    def open(cls, agent: Agent, cols: int, rows: int) -> ContainerShell:
        """Start the shell in ``agent``'s container with a ``cols`` × ``rows`` terminal. Raises the
        docker SDK's errors (``docker.errors.NotFound`` for a container that is gone)."""
        client = docker_client_for(runtime_for_scaler(agent.scaler), timeout=30)
        try:
            container_id = agent.managed_id or agent.agent_id
            exec_id = client.api.exec_create(
                container_id, SHELL_COMMAND, stdin=True, tty=True, environment={"TERM": "xterm-256color"}
            )["Id"]
            stream = client.api.exec_start(exec_id, tty=True, socket=True)
        except BaseException:
            client.close()
            raise
        shell = cls(client, container_id, exec_id, stream)
        with contextlib.suppress(Exception):  # a terminal of the default size is still a shell
            shell.resize(cols, rows)
        return shell

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size (blocking). Raises the SDK's errors."""
        self.client.api.exec_resize(self.exec_id, height=rows, width=cols)

    async def read(self) -> bytes:
        """The next output (b"" once the shell ended), without :data:`PID_MARK`."""
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, READ_BYTES)
            if self.pid is not None or not data:
                head, self._head = self._head, b""
                return head + data
            self._head += data
            found = PID_MARK.search(self._head)
            if found:
                self.pid = found.group(1).decode()
                head, self._head = self._head[: found.start()] + self._head[found.end() :], b""
                if head:
                    return head
            elif len(self._head) > PID_MARK_WINDOW:
                self.pid = ""  # no mark: the shell cannot be ended from inside (logged at close)
                head, self._head = self._head, b""
                return head

    async def write(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    def close(self) -> None:
        """End the shell and every process of its session in the container (a detached exec: HUP,
        then KILL a second later), then the connection (blocking, two docker calls; idempotent).
        Errors are logged: the container may be gone."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.pid:
                script = KILL_SESSION.format(sid=self.pid, signal="HUP") + "; sleep 1; "
                script += KILL_SESSION.format(sid=self.pid, signal="KILL")
                kill = self.client.api.exec_create(self.container_id, ["/bin/sh", "-c", script])["Id"]
                self.client.api.exec_start(kill, detach=True)  # it runs its second on its own
            elif self.client.api.exec_inspect(self.exec_id).get("Running"):
                log.warning("shell exec %s announced no pid: its processes are left running", self.exec_id)
        except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
            # the container stopped or is gone, or its daemon: nothing left to end
            log.info("shell exec %s: its processes were not ended (%s)", self.exec_id, str(exc).splitlines()[0][:200])
        finally:
            for part in (self.sock, self._stream, self.client):
                with contextlib.suppress(Exception):
                    part.close()


def stamp(moment: datetime) -> str:
    """``moment`` as a shell's records write it: UTC, to the second (``2026-12-05T15:30:00Z``)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def terminal_size(cols: int, rows: int) -> tuple[int, int]:
    """``(cols, rows)`` held to the sizes a shell's terminal may take (2-1000 × 2-500)."""
    return max(2, min(cols, 1000)), max(2, min(rows, 500))


def _typed(line: bytes) -> str:
    """A typed line as readable text: control characters (arrows, Ctrl-C, …) as ``\\xNN``."""
    text = line.decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() or ch == "\t" else f"\\x{ord(ch):02x}" for ch in text)


class Transcript:
    """One shell session appended to the agent's ``shell.log`` (module doc). Opening it writes the
    header; :meth:`output` and :meth:`typed` append as the session goes (so a closed browser or a
    stopped console loses nothing written); :meth:`close` writes the footer. Raises OSError from
    :meth:`open` when the file cannot be opened; later write errors are logged and end the
    recording, never the shell."""

    def __init__(self, agent_id: str, user: str) -> None:
        self.path = shell_transcript_path(agent_id)
        self.user = user
        self.fd: int | None = None
        self.size = 0
        self.unrecorded = 0  # output bytes past TRANSCRIPT_MAX_BYTES
        self._line = b""

    def open(self, header: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        self.size = os.fstat(self.fd).st_size
        self._write(f"\n=== {header} ===\n".encode(), always=True)

    def _write(self, data: bytes, *, always: bool = False) -> bool:
        """Append ``data``; False when the cap left it out (``always``: the markers, with a cap
        of their own one MiB higher)."""
        if self.fd is None:
            return False
        limit = TRANSCRIPT_MAX_BYTES + (1024 * 1024 if always else 0)
        if self.size + len(data) > limit:
            return False
        try:
            os.write(self.fd, data)
        except OSError:
            log.warning("shell transcript %s: write failed; recording stops", self.path, exc_info=True)
            self._stop()
            return False
        self.size += len(data)
        return True

    def output(self, data: bytes) -> None:
        if not self._write(data):
            self.unrecorded += len(data)

    def typed(self, data: bytes, now: datetime) -> None:
        """Keystrokes: each line (ended by Enter) is written under a marker of who typed it, when
        (the terminal's own reports left out: :data:`TERMINAL_REPORTS`)."""
        self._line += TERMINAL_REPORTS.sub(b"", data)
        while True:
            cut = min((i for i in (self._line.find(b"\r"), self._line.find(b"\n")) if i >= 0), default=-1)
            if cut < 0 and len(self._line) < INPUT_LINE_MAX:
                return
            end = cut if cut >= 0 else INPUT_LINE_MAX
            line, self._line = self._line[:end], self._line[end + (1 if cut >= 0 else 0) :]
            self._mark_line(line, now)

    def _mark_line(self, line: bytes, now: datetime) -> None:
        if not line:  # Enter alone, or the \n of a pasted \r\n
            return
        self._write(f"\n[kici-shell input by {self.user} at {stamp(now)}] {_typed(line)}\n".encode(), always=True)

    def close(self, footer: str, now: datetime) -> None:
        if self._line:
            self._mark_line(self._line, now)
            self._line = b""
        if self.unrecorded:
            footer += (
                f"; {format_bytes_iec(self.unrecorded)} of output not recorded "
                f"(the transcript keeps at most {format_bytes_iec(TRANSCRIPT_MAX_BYTES)})"
            )
        self._write(f"\n=== {footer} ===\n".encode(), always=True)
        self._stop()

    def _stop(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
