"""An agent's console streams and what is behind each: a log file, or a container's docker logs.

One resolution for the console page, its download and the console WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import redis
from django.conf import settings

from agents.archive import archived_lines
from agents.choices import EventType
from agents.models import ScalerEvent
from consolelog.dockerlogs import RedisCheckpoints
from consolelog.tail import Opener, plain_open
from scalers.backends.firecracker.jail import open_vm_file
from scalers.backends.runtime import docker_client_for, runtime_for_scaler

from .sources import SourceFactory, docker_log_source, file_source


def console_streams_of(agent) -> tuple[str, ...]:
    """The console streams an agent has: ``("serial", "vmm")`` for a VM, else ``("console",)``."""
    return ("serial", "vmm") if agent.scaler.type == "firecracker" else ("console",)


def firecracker_log_path(agent, stream: str) -> Path:
    """Where a VM's ``serial`` or ``vmm`` log is: ``backend_context["console_logs"][stream]``, else in
    ``backend_context["chroot"]``, else under ``<chrootBaseDir>/firecracker/<id>/root``."""
    ctx = agent.backend_context or {}
    explicit = (ctx.get("console_logs") or {}).get(stream)
    if explicit:
        return Path(explicit)
    name = "serial-console.log" if stream == "serial" else "vmm.log"
    if ctx.get("chroot"):
        return Path(ctx["chroot"]) / name
    base = (agent.scaler.config or {}).get("chrootBaseDir") or "/srv/jailer"
    return Path(base) / "firecracker" / agent.agent_id / "root" / name


def agent_container(agent, **client_kwargs):
    """The docker SDK ``Container`` of a container agent: its ``managed_id``, else the agent id as
    the container's name, on its scaler's runtime (``client_kwargs`` go to
    ``scalers.backends.runtime.docker_client_for``, e.g. ``timeout``). Raises the SDK's errors
    (``docker.errors.NotFound``, ``DockerException``)."""
    client = docker_client_for(runtime_for_scaler(agent.scaler), **client_kwargs)
    return client.containers.get(agent.managed_id or agent.agent_id)


class SandboxGone(RuntimeError):
    """The agent's container no longer exists: its live output ended with it."""


def _container_or_gone(agent, **client_kwargs):
    """:func:`agent_container`, with docker's 404 said in words (:class:`SandboxGone`)."""
    import docker.errors

    try:
        return agent_container(agent, **client_kwargs)
    except docker.errors.NotFound:
        raise SandboxGone(
            f"the container of agent {agent.agent_id} is gone (the agent is {agent.state}); "
            "its live output ended with it: see the agent's timeline for what was captured"
        ) from None


def _docker_source(agent) -> SourceFactory:
    async def open_source():
        # No read timeout: a quiet container must not end its log stream.
        container = await asyncio.to_thread(_container_or_gone, agent, timeout=None)
        client = redis.Redis.from_url(settings.REDIS_URL)
        checkpoints = RedisCheckpoints(client, agent.agent_id)
        try:
            async with contextlib.aclosing(docker_log_source(container, checkpoints)) as batches:
                async for batch in batches:
                    yield batch
        finally:
            client.close()

    return open_source


def console_log_file(agent, stream: str) -> Path | None:
    """The file behind a console stream, or None when it is not a file (a container's docker logs).

    Firecracker ``serial`` / ``vmm``: ``backend_context["console_logs"][stream]``, else
    ``backend_context["chroot"]``, else ``<chrootBaseDir>/firecracker/<id>/root``.
    ``console``: ``backend_context["log_path"]`` when set (a bare-metal process's output file). Raises
    ``LookupError`` for a stream the agent does not have. For the full-log download as well as the
    live stream.
    """
    if stream not in console_streams_of(agent):
        raise LookupError(f"agent {agent.agent_id} has no console stream {stream!r}")
    if stream in ("serial", "vmm"):
        return firecracker_log_path(agent, stream)
    path = (agent.backend_context or {}).get("log_path")
    return Path(path) if path else None


def console_file_opener(stream: str) -> Opener:
    """How the file of a console stream is opened (``consolelog.tail.Opener``): a VM's ``serial`` and
    ``vmm`` logs sit in a chroot the VM's uid writes, so they go through
    ``scalers.backends.firecracker.jail.open_vm_file`` (no link followed, a planted one refused
    with its path); any other file plainly."""
    return open_vm_file if stream in ("serial", "vmm") else plain_open


def runs_in_container(agent) -> bool:
    """A container scaler's agent, or a bare-metal one in container mode (its docker logs are its
    console)."""
    if agent.scaler.type == "container":
        return True
    return agent.scaler.type == "bare-metal" and (agent.backend_context or {}).get("mode") == "container"


def console_source(agent, stream: str) -> tuple[SourceFactory, bool]:
    """``(source, flag_failures)`` of one console stream of ``agent``; ``LookupError`` if none.

    A file (see :func:`console_log_file`) is followed with :func:`live.sources.file_source`;
    serial lines are checked for failure patterns. A container without a log file streams its
    docker logs (container ``managed_id``, else the agent id as its name).
    """
    path = console_log_file(agent, stream)
    if path is not None:
        return file_source(path, opener=console_file_opener(stream)), stream == "serial"
    if runs_in_container(agent):
        return _docker_source(agent), False
    raise LookupError(f"agent {agent.agent_id} ({agent.scaler.type}) has no console output to stream")


#: Separator of the captured output in a ``scaler.failed`` detail
#: (``scalers.backends.failure.failure_detail``).
CAPTURED_MARKER = "\n--- captured output ---\n"


def sandbox_gone(agent, stream: str) -> bool:
    """True when a finished agent (``destroyed`` / ``failed``) has nothing left behind ``stream``:
    its container is removed with it, and a VM's or process's log file no longer exists."""
    if agent.is_active:
        return False
    try:
        path = console_log_file(agent, stream)
    except LookupError:
        return True
    return path is None or not path.exists()


def captured_output(agent) -> dict:
    """What was kept of a finished agent's output: the end of its archive (``agents.archive``), else the
    last lines (up to 50) of its latest ``scaler.failed`` event (or its ``failure_reason``). Returns
    ``{"event", "message", "lines", "first", "archived"}`` (and an archive's ``oldest``, its first
    line's number): ``first`` is the number of ``lines[0]``, an archive's lines keeping theirs, captured
    lines counted from 1; ``lines`` is empty when nothing was kept.
    """
    from django.db.models import Q

    event = (
        ScalerEvent.objects.filter(Q(agent=agent) | Q(agent_ref=agent.agent_id), type=EventType.FAILED)
        .order_by("-created_at", "-id")
        .first()
    )
    text = event.detail if event is not None else (agent.failure_reason or "")
    message, marker, rest = text.partition(CAPTURED_MARKER)
    archived = archived_lines(agent.agent_id)
    if archived is not None and archived.lines:
        return {
            "event": event,
            "message": message.strip(),
            "lines": archived.lines,
            "first": archived.first,
            "oldest": archived.oldest,
            "archived": True,
        }
    lines = rest.split("\n") if marker and rest else []
    return {"event": event, "message": message.strip(), "lines": lines, "first": 1, "archived": False}
