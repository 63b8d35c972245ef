"""WebSocket consumers: an agent's live console and the live event feeds (issue 7).

Routes (``agents.routing``), behind ``AllowedHostsOriginValidator(AuthMiddlewareStack(...))`` in
``kici_site/asgi.py`` (origin must match ``ALLOWED_HOSTS``):

* ``ws/agents/<agent_id>/console/<stream>/`` → :class:`ConsoleConsumer`; ``stream`` is ``serial``
  or ``vmm`` for a Firecracker VM (``serial-console.log`` / ``vmm.log`` in its chroot), ``console``
  for a container (its docker logs) or any agent whose ``backend_context["console_log"]`` names a
  file;
* ``ws/events/`` and ``ws/agents/<agent_id>/events/`` → :class:`EventsConsumer`, relaying the
  ``events.global`` / ``events.agent.<agent_id>`` groups (producers call
  ``agents.streams.publish_event``).

Both need an authenticated user with ``agents.view_agent``; otherwise the socket is accepted and
closed at once with code 4403 (a code the htmx ``ws`` extension does not reconnect on). An unknown
agent or stream closes with 4404.

Messages to the browser (text frames, HTML for the htmx ``ws`` extension, each top-level element
swapped out of band):

* console, first frame and after a restart of the stream (a new generation):
  ``<tbody id="console-lines" hx-swap-oob="innerHTML">ROWS</tbody>`` — replaces what is shown
  (the last 500 lines);
* console, live: ``<tbody id="console-lines" hx-swap-oob="beforeend">ROWS</tbody>``;
  ROWS come from the ``lines`` partial (``agents/console.html#lines`` when the page defines it,
  else ``agents/console_lines.html#lines``) with context ``lines`` (``agents.streams.Line``: text,
  seq, level, dropped). A viewer that cannot keep up gets a ``… N lines dropped`` row
  (``dropped`` > 0) in place of the lines it missed;
* events: the HTML rendered by ``agents.render.render_live_update`` for each event, several per
  frame; a slow viewer gets ``<tbody hx-swap-oob="afterbegin:#event-rows">`` with one
  ``… N events dropped`` row.

Frames go out at most every :data:`FRAME_INTERVAL` seconds with at most :data:`FRAME_MAX_ROWS`
rows. Optional flow control: connect with ``?flow=ack`` and send ``{"ack": 1}`` (any JSON object
with an ``ack`` count) after handling each frame; at most :data:`ACK_WINDOW` frames are then in
flight, and a client that stops acknowledging loses lines to the drop row instead of growing the
server's socket buffers (daphne does not apply back-pressure on WebSocket sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections import OrderedDict
from pathlib import Path
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.template import TemplateDoesNotExist
from django.template.loader import get_template, render_to_string

from .streams import (
    EVENTS_GLOBAL_GROUP,
    ConsoleHub,
    Line,
    RedisTransport,
    SourceFactory,
    StreamKey,
    ViewerBuffer,
    docker_log_source,
    events_agent_group,
    file_source,
)

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404

FRAME_INTERVAL = 0.05
"""Seconds between two frames to one viewer (so at most 20 frames/s per viewer)."""

FRAME_MAX_ROWS = 500
"""Most rows in one frame; the rest wait in the viewer's bounded buffer."""

ACK_WINDOW = 4
"""Frames in flight to a ``?flow=ack`` viewer."""

EVENT_BUFFER = 1000
"""Events buffered per viewer before the oldest become one drop row."""

CONSOLE_TBODY_ID = "console-lines"
ROW_TEMPLATES = ("agents/console.html#lines", "agents/console_lines.html#lines")
FALLBACK_TEMPLATE = "agents/console_lines.html"

_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_row_template = None


# --- per-process singletons ------------------------------------------------------------------------


def get_console_hub() -> ConsoleHub:
    """This process's hub (one per event loop) on the Redis layer ``settings.CHANNEL_LAYERS``.

    Its :class:`agents.streams.RedisTransport` also carries the event groups. Call from a
    coroutine.
    """
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        import redis.asyncio
        from channels.layers import get_channel_layer

        transport = RedisTransport(get_channel_layer(), redis.asyncio.from_url(settings.REDIS_URL))
        hub = ConsoleHub(transport)
        _hubs[loop] = hub
    return hub


async def close_console_hub() -> None:
    """Stop this loop's hub, its pumps and its relay channel (tests, shutdown)."""
    hub = _hubs.pop(asyncio.get_running_loop(), None)
    if hub is None:
        return
    await hub.aclose()
    await hub.transport.aclose()
    with contextlib.suppress(Exception):
        await hub.transport.redis.aclose()


# --- access and sources -----------------------------------------------------------------------------


@database_sync_to_async
def _may_view(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm("agents.view_agent"))


def console_streams_of(agent) -> tuple[str, ...]:
    """The console streams an agent has: ``("serial", "vmm")`` for a VM, else ``("console",)``."""
    return ("serial", "vmm") if agent.scaler.type == "firecracker" else ("console",)


def firecracker_log_path(agent, stream: str) -> Path:
    ctx = agent.backend_context or {}
    explicit = (ctx.get("console_logs") or {}).get(stream)
    if explicit:
        return Path(explicit)
    name = "serial-console.log" if stream == "serial" else "vmm.log"
    if ctx.get("chroot"):
        return Path(ctx["chroot"]) / name
    base = (agent.scaler.config or {}).get("chrootBaseDir") or "/srv/jailer"
    return Path(base) / "firecracker" / agent.agent_id / "root" / name


def _docker_source(agent) -> SourceFactory:
    async def open_source():
        from scalers.backends.runtime import docker_client_for, runtime_for_scaler

        def find():
            # No read timeout: a quiet container must not end its log stream.
            client = docker_client_for(runtime_for_scaler(agent.scaler), timeout=None)
            return client.containers.get(agent.managed_id or agent.agent_id)

        container = await asyncio.to_thread(find)
        async with contextlib.aclosing(docker_log_source(container)) as batches:
            async for batch in batches:
                yield batch

    return open_source


def console_log_file(agent, stream: str) -> Path | None:
    """The file behind a console stream, or None when it is not a file (a container's docker logs).

    Firecracker ``serial`` / ``vmm``: ``backend_context["console_logs"][stream]``, else
    ``backend_context["chroot"]``, else ``<chrootBaseDir>/firecracker/<id>/root`` (SPEC h).
    ``console``: ``backend_context["console_log"]`` when set. Raises ``LookupError`` for a stream
    the agent does not have. For the full-log download as well as the live stream.
    """
    if stream not in console_streams_of(agent):
        raise LookupError(f"agent {agent.agent_id} has no console stream {stream!r}")
    if stream in ("serial", "vmm"):
        return firecracker_log_path(agent, stream)
    path = (agent.backend_context or {}).get("console_log")
    return Path(path) if path else None


def console_source(agent, stream: str) -> tuple[SourceFactory, bool]:
    """``(source, flag_failures)`` of one console stream of ``agent``; ``LookupError`` if none.

    A file (see :func:`console_log_file`) is followed with :func:`agents.streams.file_source`;
    serial lines are checked for failure patterns. A container without a log file streams its
    docker logs (container ``managed_id``, else the agent id as its name).
    """
    path = console_log_file(agent, stream)
    if path is not None:
        return file_source(path), stream == "serial"
    if agent.scaler.type == "container":
        return _docker_source(agent), False
    raise LookupError(f"agent {agent.agent_id} ({agent.scaler.type}) has no console output to stream")


@database_sync_to_async
def _load_agent(agent_id: str):
    from .models import Agent

    return Agent.objects.select_related("scaler").filter(agent_id=agent_id).first()


# --- rendering ---------------------------------------------------------------------------------------


def _rows_template():
    global _row_template
    if _row_template is None:
        for name in ROW_TEMPLATES:
            try:
                _row_template = get_template(name)
                break
            except TemplateDoesNotExist:
                continue
    return _row_template


def render_console_rows(lines: list[Line]) -> str:
    """Rows for ``lines`` from the console ``lines`` partial (see the module docstring)."""
    return _rows_template().render({"lines": lines})


def render_console_frame(lines: list[Line], *, replace: bool) -> str:
    """One console frame: the rows wrapped for an out-of-band swap into ``#console-lines``."""
    swap = "innerHTML" if replace else "beforeend"
    return f'<tbody id="{CONSOLE_TBODY_ID}" hx-swap-oob="{swap}">{render_console_rows(lines)}</tbody>'


class _Flow:
    """The ``?flow=ack`` window: ``await acquire()`` before a frame, ``ack(n)`` on the client's word."""

    def __init__(self, window: int):
        self.window = window
        self.in_flight = 0
        self._changed = asyncio.Event()

    async def acquire(self) -> None:
        while self.in_flight >= self.window:
            self._changed.clear()
            await self._changed.wait()
        self.in_flight += 1

    def ack(self, count: int) -> None:
        self.in_flight = max(0, self.in_flight - max(0, count))
        self._changed.set()


def _flow_from_scope(scope) -> _Flow | None:
    query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    return _Flow(ACK_WINDOW) if "ack" in query.get("flow", []) else None


def _ack_count(text_data: str | None) -> int:
    if not text_data:
        return 0
    if text_data.strip() == "ack":
        return 1
    try:
        data = json.loads(text_data)
    except ValueError:
        return 0
    if not isinstance(data, dict) or "ack" not in data:
        return 0
    try:
        return max(0, min(int(data["ack"]), 1000))
    except (TypeError, ValueError):
        return 1


class _LiveConsumer(AsyncWebsocketConsumer):
    """Common parts: access check, flow control, the writer task."""

    writer: asyncio.Task | None = None
    flow: _Flow | None = None

    async def _refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def _allowed(self) -> bool:
        if await _may_view(self.scope.get("user")):
            return True
        await self._refuse(CLOSE_FORBIDDEN)
        return False

    async def receive(self, text_data=None, bytes_data=None):
        if self.flow is not None:
            count = _ack_count(text_data)
            if count:
                self.flow.ack(count)

    async def _send_frame(self, text: str, *, reserved: bool = False) -> None:
        if self.flow is not None and not reserved:
            await self.flow.acquire()
        await self.send(text_data=text)

    async def _next_frame(self) -> str | None:
        raise NotImplementedError

    async def _write(self) -> None:
        try:
            while True:
                if self.flow is not None:
                    await self.flow.acquire()  # room first: meanwhile lines wait in the bounded buffer
                frame = await self._next_frame()
                if frame:
                    await self._send_frame(frame, reserved=True)
                elif self.flow is not None:
                    self.flow.ack(1)  # give the unused slot back
                await asyncio.sleep(FRAME_INTERVAL)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the socket is gone or rendering broke: end this viewer
            log.warning("live writer stopped", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def _stop_writer(self) -> None:
        if self.writer is not None:
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.writer
            self.writer = None


class ConsoleConsumer(_LiveConsumer):
    """One viewer of ``ws/agents/<agent_id>/console/<stream>/`` (see the module docstring)."""

    viewer = None

    async def connect(self):
        if not await self._allowed():
            return
        kwargs = self.scope["url_route"]["kwargs"]
        try:
            key = StreamKey(kwargs.get("agent_id", ""), kwargs.get("stream", ""))
        except ValueError:
            return await self._refuse(CLOSE_NOT_FOUND)
        agent = await _load_agent(key.agent_id)
        if agent is None:
            return await self._refuse(CLOSE_NOT_FOUND)
        try:
            source, flag_failures = console_source(agent, key.stream)
        except LookupError:
            return await self._refuse(CLOSE_NOT_FOUND)
        self.flow = _flow_from_scope(self.scope)
        # Subscribed before the socket opens: once the client sees it open, nothing is missed.
        self.viewer = await get_console_hub().subscribe(key, source, flag_failures=flag_failures)
        await self.accept()
        await self._send_frame(render_console_frame(self.viewer.snapshot, replace=True))
        self.writer = asyncio.create_task(self._write())

    async def _next_frame(self) -> str | None:
        rows, reset = await self.viewer.next_batch(FRAME_MAX_ROWS)
        if not rows and not reset:
            return None
        return render_console_frame(rows, replace=reset)

    async def disconnect(self, code):
        await self._stop_writer()
        if self.viewer is not None:
            viewer, self.viewer = self.viewer, None
            await get_console_hub().unsubscribe(viewer)


# --- events -------------------------------------------------------------------------------------------

_RENDER_CACHE_SIZE = 256
_render_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rendered(event_id: int) -> asyncio.Future:
    """The live HTML of an event that came without it, rendered once per process."""
    loop = asyncio.get_running_loop()
    cache = _render_cache.setdefault(loop, OrderedDict())
    task = cache.get(event_id)
    if task is None:
        from .render import render_live_update

        task = asyncio.ensure_future(database_sync_to_async(render_live_update)(event_id))
        cache[event_id] = task
        while len(cache) > _RENDER_CACHE_SIZE:
            cache.popitem(last=False)
    return task


class EventsConsumer(_LiveConsumer):
    """``ws/events/`` (all events) or ``ws/agents/<agent_id>/events/`` (one agent's timeline).

    Relays the ``event.message`` group messages of ``events.global`` /
    ``events.agent.<agent_id>`` (their ``html``), batched per frame, through a bounded buffer.
    """

    group: str | None = None
    buffer: ViewerBuffer | None = None

    async def connect(self):
        if not await self._allowed():
            return
        agent_id = self.scope["url_route"]["kwargs"].get("agent_id")
        try:
            self.group = events_agent_group(agent_id) if agent_id else EVENTS_GLOBAL_GROUP
        except ValueError:
            return await self._refuse(CLOSE_NOT_FOUND)
        self.flow = _flow_from_scope(self.scope)
        self.buffer = ViewerBuffer(EVENT_BUFFER, ordered=False, noun="events")
        await get_console_hub().transport.listen(self.group, self._on_event)
        await self.accept()
        self.writer = asyncio.create_task(self._write())

    def _on_event(self, message: dict) -> None:
        if message.get("type") != "event.message":
            return
        html = message.get("html")
        event_id = message.get("event_id") or 0
        if html is not None:
            self.buffer.push([Line(html, event_id, "event")])
        elif event_id:
            task = _rendered(event_id)
            task.add_done_callback(lambda t, event_id=event_id: self._on_rendered(t, event_id))

    def _on_rendered(self, task: asyncio.Future, event_id: int) -> None:
        if self.buffer is None or task.cancelled() or task.exception() is not None:
            return
        if task.result():
            self.buffer.push([Line(task.result(), event_id, "event")])

    async def _next_frame(self) -> str | None:
        rows, _ = await self.buffer.next_batch(FRAME_MAX_ROWS)
        parts = []
        for row in rows:
            if row.dropped:
                parts.append(render_to_string(f"{FALLBACK_TEMPLATE}#events_dropped", {"count": row.dropped}))
            else:
                parts.append(row.text)
        return "\n".join(parts) if parts else None

    async def disconnect(self, code):
        await self._stop_writer()
        if self.group is not None:
            group, self.group = self.group, None
            with contextlib.suppress(Exception):
                await get_console_hub().transport.unlisten(group, self._on_event)
