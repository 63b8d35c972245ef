"""WebSocket consumers: an agent's live console, the live event feeds, an operation's progress, the
live rows, the attention badge and an approver's shell into an agent. Their routes, permissions,
close codes, frames and flow control are in docs/live-streams.md ("The sockets"); the shell's in
docs/shell.md."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import weakref
from collections import OrderedDict
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import QueryDict
from django.template.loader import render_to_string
from django.utils import timezone

from agents.models import Agent
from audit.choices import AuditAction
from audit.records import record_audit, user_actor
from lib.json_input import parse_json
from lib.units import format_bytes_iec, format_duration
from operations.models import Operation
from operations.presenters import detail_context

from .attention import ATTENTION_GROUPS, ATTENTION_MIN_SECONDS, ATTENTION_POLL_SECONDS, SHARED
from .consoles import console_source
from .hub import ConsoleHub
from .publish import EVENTS_GLOBAL_GROUP, events_agent_group, operation_group
from .render import render_live_update
from .rows import MAX_DIRTY, ROW_BATCH_SECONDS, RowView, row_view
from .session import CLOSE_FORBIDDEN, CLOSE_SIGNED_OUT, SessionBound
from .shell import (
    SHELL_PERM,
    SHELL_STATES,
    ContainerShell,
    Transcript,
    may_open_shells,
    shell_refusal,
    stamp,
    terminal_size,
)
from .streams import Line, StreamKey, ViewerBuffer, console_row
from .transport import RedisTransport

log = logging.getLogger(__name__)


ACK_WINDOW = 4
"""Frames in flight to a ``?flow=ack`` viewer."""


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
        data = parse_json(text_data)
    except ValueError:
        return 0
    if not isinstance(data, dict) or "ack" not in data:
        return 0
    try:
        return max(0, min(int(data["ack"]), 1000))
    except (TypeError, ValueError):
        return 1


CLOSE_NOT_FOUND = 4404

FRAME_INTERVAL = 0.05
"""Seconds between two frames to one viewer (so at most 20 frames/s per viewer)."""

FRAME_MAX_ROWS = 500
"""Most rows in one frame; the rest wait in the viewer's bounded buffer."""


@database_sync_to_async
def _may_view(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm("agents.view_agent"))


class _LiveConsumer(SessionBound):
    """Common parts: access check, flow control, the writer task, the session binding."""

    writer: asyncio.Task | None = None
    flow: _Flow | None = None

    async def _refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def _allowed(self) -> bool:
        if await _may_view(self.scope.get("user")):
            await self.bind_session("agents.view_agent")
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
        except Exception:  # the socket is gone or rendering broke: end this viewer
            log.warning("live writer stopped", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def _stop_writer(self) -> None:
        await self.unbind_session()
        if self.writer is not None:
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.writer
            self.writer = None


_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def get_console_hub() -> ConsoleHub:
    """This process's hub (one per event loop) on the Redis layer ``settings.CHANNEL_LAYERS``.

    Its :class:`live.transport.RedisTransport` also carries the event groups. Call from a
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


EVENTS_DROPPED_TEMPLATE = "dashboard/index.html#events_dropped"


def console_frame(lines: list[Line], *, reset: bool) -> str:
    """One console frame: ``{"reset": bool, "rows": [console_row, ...]}`` as JSON (``reset``: the
    rows replace what the page shows)."""
    return json.dumps({"reset": reset, "rows": [console_row(line) for line in lines]}, separators=(",", ":"))


@database_sync_to_async
def _load_agent(agent_id: str):
    return Agent.objects.select_related("scaler").filter(agent_id=agent_id).first()


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
        await self._send_frame(console_frame(self.viewer.snapshot, reset=True))
        self.writer = asyncio.create_task(self._write())

    async def _next_frame(self) -> str | None:
        assert self.viewer is not None, "the writer runs only while the viewer is subscribed"
        rows, reset = await self.viewer.next_batch(FRAME_MAX_ROWS)
        if not rows and not reset:
            return None
        return console_frame(rows, reset=reset)

    async def disconnect(self, code):
        await self._stop_writer()
        if self.viewer is not None:
            viewer, self.viewer = self.viewer, None
            await get_console_hub().unsubscribe(viewer)


EVENT_BUFFER = 1000
"""Events buffered per viewer before the oldest become one drop row."""

_RENDER_CACHE_SIZE = 256
_render_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rendered(event_id: int) -> asyncio.Future:
    """The live HTML of an event that came without it, rendered once per process."""
    loop = asyncio.get_running_loop()
    cache = _render_cache.setdefault(loop, OrderedDict())
    task = cache.get(event_id)
    if task is None:
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
        assert self.buffer is not None, "made in connect before this listener is added"
        html = message.get("html")
        event_id = message.get("event_id") or 0
        if html is not None:
            self.buffer.push([Line(html, event_id, "event")])
        elif event_id:
            task = _rendered(event_id)
            task.add_done_callback(functools.partial(self._on_rendered, event_id=event_id))

    def _on_rendered(self, task: asyncio.Future, event_id: int) -> None:
        if self.buffer is None or task.cancelled() or task.exception() is not None:
            return
        if task.result():
            self.buffer.push([Line(task.result(), event_id, "event")])

    async def _next_frame(self) -> str | None:
        assert self.buffer is not None, "made in connect before the writer starts"
        rows, _ = await self.buffer.next_batch(FRAME_MAX_ROWS)
        parts: list[str] = []
        for row in rows:
            if row.dropped:
                parts.append(render_to_string(EVENTS_DROPPED_TEMPLATE, {"count": row.dropped}))
            else:
                parts.append(row.text)
        return "\n".join(parts) if parts else None

    async def disconnect(self, code):
        await self._stop_writer()
        if self.group is not None:
            group, self.group = self.group, None
            with contextlib.suppress(Exception):
                await get_console_hub().transport.unlisten(group, self._on_event)


def render_update(
    operation_id: int, user, keys=None, log_from: int | None = None, snapshot: bool = False, log_to: int | None = None
) -> list[str] | None:
    """The WebSocket messages of one push (None when the operation is gone): status, progress, new
    log lines and audit; then, in a message of their own, the target rows of ``keys`` (every row
    when ``keys`` is None). Table rows travel alone because an HTML template parses ``<tr>`` only
    when the first element is table content."""
    operation = (
        Operation.objects.select_related("scaler", "label_set", "requested_by", "approved_by", "rejected_by")
        .filter(pk=operation_id)
        .first()
    )
    if operation is None:
        return None
    if snapshot:
        context = detail_context(operation, user, keys=keys)
    else:
        context = detail_context(operation, user, keys=keys, log_from=log_from or 0, log_to=log_to)
        if log_from is None:
            context["log_entries"] = []
    context.update(oob=True, snapshot=snapshot)
    messages: list[str] = [render_to_string("operations/detail.html#live_update", context)]
    if context["rows"]:
        messages.append(render_to_string("operations/detail.html#live_rows", context).strip())
    return messages


class OperationConsumer(SessionBound):
    async def connect(self):
        user = self.scope.get("user")
        if not (
            user and user.is_authenticated and await database_sync_to_async(user.has_perm)("operations.view_operation")
        ):
            await self.close(code=4403)
            return
        self.operation_id = int(self.scope["url_route"]["kwargs"]["operation_id"])
        self.group = operation_group(self.operation_id)
        await self.bind_session("operations.view_operation")
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        messages = await database_sync_to_async(render_update)(self.operation_id, user, snapshot=True)
        if messages is None:
            await self.close(code=4404)
            return
        for html in messages:
            await self.send(text_data=html)

    async def disconnect(self, code):
        await self.unbind_session()
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def operation_progress(self, event):
        keys = event.get("keys") or []
        messages = await database_sync_to_async(render_update)(
            self.operation_id, self.scope["user"], keys=keys, log_from=event.get("log_from"), log_to=event.get("log_to")
        )
        for html in messages or []:
            await self.send(text_data=html)


ROW_GATHER_SECONDS = 0.05
"""A first change waits this long for the rest of its burst before its frame goes out."""


class RowsConsumer(SessionBound):
    """``ws/rows/<view>/?<filters>``: the rows of one page (:func:`live.rows.row_view`).

    On connect: the view's rows as they are now (a ``data-sync`` frame), then, at most once per
    :data:`live.rows.ROW_BATCH_SECONDS`, one frame with the rows whose ids arrived in
    ``rows.dirty`` notices meanwhile (changed, new, or removed from the view). A viewer that
    collects more than :data:`live.rows.MAX_DIRTY` ids gets a full sync instead. Closes with 4403
    without the view's permission, 4404 for an unknown view, agent or scaler or a bad parameter.
    """

    view: RowView | None = None
    flusher: asyncio.Task | None = None

    async def connect(self):
        user = self.scope.get("user")
        if not (user is not None and user.is_authenticated and user.is_active):
            return await self._refuse(CLOSE_FORBIDDEN)
        name = self.scope["url_route"]["kwargs"].get("view", "")
        params = QueryDict((self.scope.get("query_string") or b"").decode("latin-1"))
        try:
            view = await database_sync_to_async(row_view)(name, params)
        except LookupError:
            return await self._refuse(CLOSE_NOT_FOUND)
        if not await database_sync_to_async(user.has_perm)(view.perm):
            return await self._refuse(CLOSE_FORBIDDEN)
        view.user = user
        self.view, self.dirty, self.overflow, self.last_frame = view, set(), False, 0.0
        await self.bind_session(view.perm)
        for group in view.groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        frames, self.shown = await database_sync_to_async(view.snapshot)()
        for frame in frames:
            await self.send(text_data=frame)
        self.last_frame = asyncio.get_running_loop().time()

    async def _refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def rows_dirty(self, message):
        if self.view is None:
            return
        keys = message.get(self.view.noun) or ()
        if not keys:
            return
        if not self.overflow:
            self.dirty.update(keys)
            if len(self.dirty) > MAX_DIRTY:
                self.overflow, self.dirty = True, set()
        if self.flusher is None:
            self.flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        view = self.view
        assert view is not None, "set in connect; rows_dirty starts a flush only once it is"
        loop = asyncio.get_running_loop()
        try:
            while self.dirty or self.overflow:
                await asyncio.sleep(max(ROW_GATHER_SECONDS, self.last_frame + ROW_BATCH_SECONDS - loop.time()))
                keys, overflow = self.dirty, self.overflow
                self.dirty, self.overflow = set(), False
                if overflow:
                    frames, self.shown = await database_sync_to_async(view.snapshot)()
                else:
                    frames, self.shown = await database_sync_to_async(view.update)(keys, self.shown)
                for frame in frames:
                    await self.send(text_data=frame)
                self.last_frame = loop.time()
        except asyncio.CancelledError:
            raise
        except Exception:  # the socket is gone or rendering broke: end this viewer
            log.warning("live rows stopped", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)
        finally:
            self.flusher = None

    async def disconnect(self, code):
        await self.unbind_session()
        if self.flusher is not None:
            self.flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.flusher
        if self.view is not None:
            for group in self.view.groups:
                with contextlib.suppress(Exception):
                    await self.channel_layer.group_discard(group, self.channel_name)


class AttentionConsumer(SessionBound):
    """``ws/attention/[?panel=1]``: the nav badge (``base.html#attention_badge``) and, with
    ``panel=1``, the dashboard's "Needs attention" list, as out-of-band swaps (:mod:`live.attention`).

    On connect: the current frame. Then a frame whenever the items change, read at least every
    :data:`live.attention.ATTENTION_POLL_SECONDS` and within about a second of a notice on
    :data:`live.attention.ATTENTION_GROUPS`, at most one per
    :data:`live.attention.ATTENTION_MIN_SECONDS`. Closes with 4403 without ``agents.view_agent``.
    """

    ticker: asyncio.Task | None = None

    async def connect(self):
        user = self.scope.get("user")
        if not (
            user is not None
            and user.is_authenticated
            and user.is_active
            and await database_sync_to_async(user.has_perm)("agents.view_agent")
        ):
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        params = QueryDict((self.scope.get("query_string") or b"").decode("latin-1"))
        self.panel = params.get("panel") == "1"
        self.sent, self.last_sent_at = None, float("-inf")
        self.noticed_at: float | None = None
        self.wake = asyncio.Event()
        await self.bind_session("agents.view_agent")
        for group in ATTENTION_GROUPS:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        # The page was rendered before this socket opened: only a read started now is newer than
        # it (an older one could take back a banner or count the page already shows).
        connected = time.monotonic()
        if not await self._send_if_changed(connected):
            self.noticed_at = connected
            self.wake.set()
        self.ticker = asyncio.create_task(self._tick())

    def _noticed(self) -> None:
        if self.noticed_at is None:
            self.noticed_at = time.monotonic()
        self.wake.set()

    async def rows_dirty(self, message):
        self._noticed()

    async def event_message(self, message):
        self._noticed()

    async def _send_if_changed(self, not_before: float) -> bool:
        """Send the shared read if its items changed; False, sending nothing, when it is older
        than ``not_before`` (the caller asks again once a newer read may be made)."""
        frames = await database_sync_to_async(SHARED.get)(not_before)
        if frames.read_at < not_before:
            return False
        if frames.key != self.sent:
            await self.send(text_data=frames.message(self.panel))
            self.sent = frames.key
            self.last_sent_at = time.monotonic()
        return True

    async def _tick(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), ATTENTION_POLL_SECONDS)
                await asyncio.sleep(
                    max(ROW_GATHER_SECONDS, self.last_sent_at + ATTENTION_MIN_SECONDS - time.monotonic())
                )
                self.wake.clear()
                # A notice comes after its commit: a read started after the notice sees it. A poll
                # takes any read of the last ATTENTION_MIN_SECONDS.
                noticed, self.noticed_at = self.noticed_at, None
                not_before = noticed if noticed is not None else time.monotonic() - ATTENTION_MIN_SECONDS
                if not await self._send_if_changed(not_before):
                    # The shared read predates the notice and the next one is not due yet.
                    await asyncio.sleep(ATTENTION_MIN_SECONDS)
                    if self.noticed_at is None:
                        self.noticed_at = not_before
                    self.wake.set()
        except asyncio.CancelledError:
            raise
        except Exception:  # the socket is gone or the read broke: end this viewer
            log.warning("live attention stopped", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def disconnect(self, code):
        await self.unbind_session()
        if self.ticker is not None:
            self.ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.ticker
        if getattr(self, "wake", None) is not None:
            for group in ATTENTION_GROUPS:
                with contextlib.suppress(Exception):
                    await self.channel_layer.group_discard(group, self.channel_name)


CLOSE_NOT_SHELLABLE = 4409
"""A shell refused: the agent is not running or held, not a container agent, or its exec failed."""

SHELL_CHECK_SECONDS = 2.0
"""Seconds between two reads of a shell's agent state (the time limits are kept to the second)."""

#: Why a shell ended when its socket closed under it, by close code.
_SOCKET_ENDS = {
    CLOSE_SIGNED_OUT: "the session ended (signed out)",
    CLOSE_FORBIDDEN: "the permission to approve operations was taken away",
}


def _terminal_size(scope) -> tuple[int, int]:
    """``(cols, rows)`` of the page's terminal from ``?cols=&rows=`` (80 × 24 when absent or bad)."""
    query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    try:
        cols, rows = int(query["cols"][0]), int(query["rows"][0])
    except (KeyError, ValueError):
        return 80, 24
    return terminal_size(cols, rows)


def _left(state: str | None) -> str:
    """Why a shell ended when its agent is no longer running or held."""
    return f"the agent left running/held: it is {state or 'gone'}"


@database_sync_to_async
def _shell_agent(user, agent_id: str) -> tuple[Agent | None, int, str | None]:
    """The agent, and the close code and reason of a refusal (reason None: the shell may open)."""
    agent = Agent.objects.select_related("scaler").filter(agent_id=agent_id).first()
    refusal = shell_refusal(user, agent)
    if not may_open_shells(user):
        return agent, CLOSE_FORBIDDEN, refusal
    return agent, CLOSE_NOT_FOUND if agent is None else CLOSE_NOT_SHELLABLE, refusal


@database_sync_to_async
def _agent_state(agent_id: str) -> str | None:
    return Agent.objects.filter(agent_id=agent_id).values_list("state", flat=True).first()


class ShellConsumer(SessionBound):
    """``ws/agents/<agent_id>/shell/?cols=&rows=[&flow=ack]``: a terminal bridged to a ``docker exec``
    with a TTY in the agent's container (:class:`live.shell.ContainerShell`), for approvers; a
    refusal (:func:`live.shell.shell_refusal`) closes with its reason and makes no exec. Frames,
    limits, audit and transcript: docs/shell.md."""

    shell: ContainerShell | None = None
    transcript: Transcript | None = None
    agent: Agent | None = None
    flow: _Flow | None = None
    reader: asyncio.Task | None = None
    watcher: asyncio.Task | None = None
    ended: bool = False
    finished: asyncio.Event

    async def connect(self):
        agent_id = self.scope["url_route"]["kwargs"].get("agent_id", "")
        agent, code, refusal = await _shell_agent(self.scope.get("user"), agent_id)
        if refusal is not None:
            return await self._refuse(code, refusal)
        assert agent is not None, "shell_refusal refuses a missing agent"
        self.agent = agent
        cols, rows = _terminal_size(self.scope)
        try:
            self.shell = await asyncio.to_thread(ContainerShell.open, agent, cols, rows)
        except Exception as exc:  # the container is gone or its daemon does not answer
            log.info("shell into %s refused: docker exec failed", agent.agent_id, exc_info=True)
            return await self._refuse(CLOSE_NOT_SHELLABLE, f"could not start a shell in agent {agent.agent_id}: {exc}")
        self.flow = _flow_from_scope(self.scope)
        self.actor, self.actor_kind = user_actor(self.scope.get("user"))
        self.opened_at, self.opened_clock = timezone.now(), time.monotonic()
        self.last_input = self.opened_clock
        self.bytes_in = self.bytes_out = 0
        self.max_seconds, self.idle_seconds = settings.KICI_SHELL_MAX_SECONDS, settings.KICI_SHELL_IDLE_SECONDS
        self.transcript = Transcript(agent.agent_id, self.actor)
        header = self._header()
        try:
            await asyncio.to_thread(self.transcript.open, header)
            await self._audit(AuditAction.SHELL_OPENED, header, at=self.opened_at)
        except Exception as exc:  # not recorded, no shell: every session is in the archive and the trail
            log.warning("shell into %s refused: it could not be recorded", agent.agent_id, exc_info=True)
            await asyncio.to_thread(self.shell.close)
            self.transcript.close("not opened: it could not be recorded", timezone.now())
            self.shell = None
            return await self._refuse(CLOSE_NOT_SHELLABLE, f"the shell could not be recorded: {exc}")
        await self.bind_session(SHELL_PERM)
        await self.accept()
        opened = {"agent": agent.agent_id, "maxSeconds": self.max_seconds, "idleSeconds": self.idle_seconds}
        await self.send(text_data=json.dumps({"opened": opened}))
        self.reader = asyncio.create_task(self._pump())
        self.watcher = asyncio.create_task(self._watch())

    async def _refuse(self, code: int, reason: str) -> None:
        await self.accept()
        await self.send(text_data=json.dumps({"closed": reason}))
        await self.close(code=code, reason=reason[:120])

    def _header(self) -> str:
        assert self.agent is not None and self.shell is not None, "set in connect"
        return (
            f"shell into agent {self.agent.agent_id} ({self.agent.state}, scaler {self.agent.scaler.name}, "
            f"container {self.shell.container_id[:12]}) opened by {self.actor} at "
            f"{stamp(self.opened_at)}; limits {format_duration(self.max_seconds)}, "
            f"idle {format_duration(self.idle_seconds)}"
        )

    async def _audit(self, action: str, detail: str, *, at) -> None:
        assert self.agent is not None, "set in connect"
        client = self.scope.get("client") or [None]
        await database_sync_to_async(record_audit)(
            action,
            actor=self.actor,
            actor_kind=self.actor_kind,
            scaler_name=self.agent.scaler.name,
            agent_ref=self.agent.agent_id,
            detail=detail,
            remote_addr=client[0],
            at=at,
        )

    async def receive(self, text_data=None, bytes_data=None):
        if self.ended or self.shell is None:
            return
        if bytes_data:
            self.last_input = time.monotonic()
            self.bytes_in += len(bytes_data)
            assert self.transcript is not None, "set in connect"
            self.transcript.typed(bytes_data, timezone.now())
            with contextlib.suppress(OSError):  # the shell ended: its reader ends the session
                await self.shell.write(bytes_data)
        elif text_data:
            await self._control(text_data)

    async def _control(self, text_data: str) -> None:
        try:
            data = parse_json(text_data)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        if self.flow is not None and (count := _ack_count(text_data)):
            self.flow.ack(count)
        size = data.get("resize")
        if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) for v in size):
            assert self.shell is not None, "set in connect"
            cols, rows = terminal_size(*size)
            with contextlib.suppress(Exception):  # an exec that just ended: the reader ends the session
                await asyncio.to_thread(self.shell.resize, cols, rows)

    async def _pump(self) -> None:
        """Output from the exec to the page (and the transcript) until the shell exits."""
        assert self.shell is not None and self.transcript is not None, "set in connect"
        try:
            while True:
                if self.flow is not None:
                    await self.flow.acquire()
                data = await self.shell.read()
                if not data:
                    break
                self.bytes_out += len(data)
                self.transcript.output(data)
                await self.send(bytes_data=data)
        except asyncio.CancelledError:
            raise
        except Exception:  # the exec's stream broke (its daemon went away): the session ends
            log.warning("shell exec stream of %s broke", self.agent, exc_info=True)
            return await self._end(await self._left_or("the connection to the container broke"))
        await self._end(await self._left_or("the shell exited"))

    async def _left_or(self, reason: str) -> str:
        """Why the exec ended: the agent leaving running/held (its container stopping ends the exec
        before the watch's next look) when it did, else ``reason``."""
        assert self.agent is not None, "set in connect"
        state = await _agent_state(self.agent.agent_id)
        return reason if state in SHELL_STATES else _left(state)

    async def _watch(self) -> None:
        """End the session at its time limit, when idle, or when the agent left running/held."""
        assert self.agent is not None, "set in connect"
        while True:
            now = time.monotonic()
            if now - self.opened_clock >= self.max_seconds:
                return await self._end(f"time limit: a shell lasts at most {format_duration(self.max_seconds)}")
            if now - self.last_input >= self.idle_seconds:
                return await self._end(f"idle: no keystroke for {format_duration(self.idle_seconds)}")
            state = await _agent_state(self.agent.agent_id)
            if state not in SHELL_STATES:
                return await self._end(_left(state))
            left = min(self.opened_clock + self.max_seconds, self.last_input + self.idle_seconds) - time.monotonic()
            await asyncio.sleep(max(0.05, min(SHELL_CHECK_SECONDS, left)))

    async def _end(self, reason: str, *, socket_open: bool = True) -> None:
        """End the session once: the exec and its processes, the transcript's footer, the
        ``shell.closed`` record; then, while the socket is open, tell the page why and close."""
        if self.ended:
            return
        self.ended = True
        self.finished = asyncio.Event()
        for task in (self.reader, self.watcher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        assert self.shell is not None and self.transcript is not None and self.agent is not None, "set in connect"
        await asyncio.to_thread(self.shell.close)
        ended_at = timezone.now()
        seconds = (ended_at - self.opened_at).total_seconds()
        summary = (
            f"shell into agent {self.agent.agent_id} by {self.actor} closed at {stamp(ended_at)} "
            f"(opened {stamp(self.opened_at)}, {seconds:.1f} s; "
            f"{format_bytes_iec(self.bytes_in)} in, {format_bytes_iec(self.bytes_out)} out): {reason}"
        )
        await asyncio.to_thread(self.transcript.close, summary, ended_at)
        try:
            await self._audit(AuditAction.SHELL_CLOSED, summary, at=ended_at)
        except Exception:  # the transcript has it; the audit write must not keep the socket open
            log.exception("shell.closed audit record of %s failed", self.agent.agent_id)
        self.finished.set()
        if socket_open:
            with contextlib.suppress(Exception):
                await self.send(text_data=json.dumps({"closed": reason}))
                await self.close(code=1000, reason=reason[:120])

    async def disconnect(self, code):
        await self.unbind_session()
        if self.shell is None:
            return
        if not self.ended:
            reason = _SOCKET_ENDS.get(code) or (
                f"the browser closed the shell (code {code})" if code else "the browser closed the shell"
            )
            # Shielded: the server may cancel a consumer that is slow to leave; the records still finish.
            await asyncio.shield(asyncio.ensure_future(self._end(reason, socket_open=False)))
        else:  # an end under way (a limit, the shell's exit) finishes its records first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.finished.wait(), 30)
