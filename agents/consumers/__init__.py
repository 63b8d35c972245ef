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

Modules (every name is importable from ``agents.consumers``): :mod:`~agents.consumers.console` and
:mod:`~agents.consumers.events` (the two consumers), :mod:`~agents.consumers.live` (their common
base), :mod:`~agents.consumers.frames` (console rendering), :mod:`~agents.consumers.flow` (``?flow=ack``)
and :mod:`~agents.consumers.hubs` (the per-process hub). Which streams an agent has, and the file or
docker logs behind each, is :mod:`agents.consoles`.
"""

from live.consoles import agent_container, console_log_file, console_source, console_streams_of, firecracker_log_path

from .console import ConsoleConsumer
from .events import EVENT_BUFFER, EventsConsumer
from .flow import ACK_WINDOW
from .frames import CONSOLE_TBODY_ID, FALLBACK_TEMPLATE, ROW_TEMPLATES, render_console_frame, render_console_rows
from .hubs import close_console_hub, get_console_hub
from .live import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, FRAME_INTERVAL, FRAME_MAX_ROWS

__all__ = [
    "ACK_WINDOW",
    "CLOSE_FORBIDDEN",
    "CLOSE_NOT_FOUND",
    "CONSOLE_TBODY_ID",
    "EVENT_BUFFER",
    "FALLBACK_TEMPLATE",
    "FRAME_INTERVAL",
    "FRAME_MAX_ROWS",
    "ROW_TEMPLATES",
    "ConsoleConsumer",
    "EventsConsumer",
    "agent_container",
    "close_console_hub",
    "console_log_file",
    "console_source",
    "console_streams_of",
    "firecracker_log_path",
    "get_console_hub",
    "render_console_frame",
    "render_console_rows",
]
