"""Live console streams and event fan-out, bounded end to end (issue 7, SPEC (h) and (i)).

Pure asyncio; Django is imported only by :func:`publish_event` / :func:`apublish_event`.

Shape of a console stream, for one ``(agent_id, stream)`` key:

* one **pump** task, in exactly one process (the owner of a Redis lock with TTL renewal, see
  :class:`RedisTransport`), reads the source — a file (:func:`file_source`: the VM's
  ``serial-console.log`` / ``vmm.log``, through :class:`agents.tail.FileTail`) or docker logs
  (:func:`docker_log_source`) — numbers the lines (``seq`` 1, 2, … per *generation*; every start of
  a pump is a new generation), flags failure lines, keeps the last 500 in a ring and publishes
  them in batches (≤ 1,000 lines, ≤ 256 KiB of text);
* every process with viewers of the key listens to the group once and hands each batch to its
  local **viewers**; each viewer has its own bounded :class:`ViewerBuffer` (2,000 lines) which turns
  overflow, and any gap in ``seq`` (a batch lost anywhere), into one ``… N lines dropped`` row;
* the pump is started when the first viewer subscribes and cancelled when the last one (in any
  process) leaves.

:class:`ConsoleHub` holds that logic; a transport carries it: :class:`LocalTransport` (one process,
in memory: unit tests, single-process tools) or :class:`RedisTransport` (the Channels Redis layer
for batches, plain Redis keys for the lock, the ring and the viewer register).

Modules, one job each: :mod:`~agents.streams.lines` (rows, levels, keys, failure flags, batch
cutting), :mod:`~agents.streams.buffer` (:class:`ViewerBuffer`), :mod:`~agents.streams.ring`
(the ``console.lines`` message and ring entries), :mod:`~agents.streams.sources` (file and docker
log sources), :mod:`~agents.streams.transport` (local and Redis transports),
:mod:`~agents.streams.hub` (:class:`ConsoleHub`) and :mod:`~agents.streams.publish` (event
fan-out). Every public name is importable from ``agents.streams``.
"""

from .buffer import VIEWER_BUFFER_LINES, ViewerBuffer
from .hub import STALE_BATCH_SECONDS, ConsoleHub, Viewer
from .lines import (
    BATCH_CHARS,
    BATCH_LINES,
    FAILURE_PATTERNS,
    LEVEL_DEBUG,
    LEVEL_DROPPED,
    LEVEL_ERROR,
    Line,
    StreamKey,
    drop_row,
    failure_indexes,
    is_failure_line,
    split_batches,
)
from .publish import (
    EVENTS_GLOBAL_GROUP,
    apublish_event,
    apublish_message,
    event_groups,
    event_message,
    events_agent_group,
    publish_event,
)
from .ring import RING_LINES, lines_from_blobs, lines_from_message, ring_blob
from .sources import (
    BACKLOG_BYTES,
    MAX_LAG_BYTES,
    SourceFactory,
    docker_log_lines,
    docker_log_source,
    docker_source,
    file_source,
)
from .transport import Listener, LocalTransport, RedisTransport, Transport, deliver_to

__all__ = [
    "BACKLOG_BYTES",
    "BATCH_CHARS",
    "BATCH_LINES",
    "EVENTS_GLOBAL_GROUP",
    "FAILURE_PATTERNS",
    "LEVEL_DEBUG",
    "LEVEL_DROPPED",
    "LEVEL_ERROR",
    "MAX_LAG_BYTES",
    "RING_LINES",
    "STALE_BATCH_SECONDS",
    "VIEWER_BUFFER_LINES",
    "ConsoleHub",
    "Line",
    "Listener",
    "LocalTransport",
    "RedisTransport",
    "SourceFactory",
    "StreamKey",
    "Transport",
    "Viewer",
    "ViewerBuffer",
    "apublish_event",
    "apublish_message",
    "deliver_to",
    "docker_log_lines",
    "docker_log_source",
    "docker_source",
    "drop_row",
    "event_groups",
    "event_message",
    "events_agent_group",
    "failure_indexes",
    "file_source",
    "is_failure_line",
    "lines_from_blobs",
    "lines_from_message",
    "publish_event",
    "ring_blob",
    "split_batches",
]
