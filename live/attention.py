"""The live "needs attention" frames: the nav badge and the pause banner on every page and the
dashboard's panel, over ``ws/attention/``. Most of what they count is announced by nothing, so
viewers poll, woken sooner by notices, and a process's viewers share one read
(:class:`SharedAttention`). Rates and costs: docs/attention.md ("Live").
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.template.loader import render_to_string

from operations.attention import needs_attention
from scalers.pauses import current_pauses

from .publish import EVENTS_GLOBAL_GROUP
from .rows import OPERATIONS_GROUP, SCALERS_GROUP

ATTENTION_POLL_SECONDS = 5.0
"""A viewer re-reads at least this often (seconds), notices or not."""

ATTENTION_MIN_SECONDS = 1.0
"""A process reads at most once, and a viewer gets at most one frame, per this many seconds."""

ATTENTION_GROUPS = (OPERATIONS_GROUP, SCALERS_GROUP, EVENTS_GLOBAL_GROUP)

BADGE_TEMPLATE = "base.html#attention_badge"
PANEL_TEMPLATE = "dashboard/index.html#attention_items"
BANNER_TEMPLATE = "base.html#pause_banner"


@dataclass(frozen=True)
class Frames:
    """One read rendered: the badge's out-of-band element, the panel's, the pause banner's,
    ``key``, the items and pauses read (equal keys: nothing changed; the HTML itself differs as its
    ages tick), and ``read_at``, when the read started (``time.monotonic()``)."""

    badge: str
    panel: str
    banner: str
    key: tuple
    read_at: float

    def message(self, panel: bool) -> str:
        """The WebSocket message: the badge and the pause banner, and with ``panel`` the
        dashboard's list too."""
        return "\n".join((self.badge, self.banner, self.panel) if panel else (self.badge, self.banner))


def read_and_render(read_at: float) -> Frames:
    """What needs attention and the pauses in force, rendered as out-of-band swaps."""
    attention, pauses = needs_attention(), current_pauses()
    ctx = {"attention": attention, "pauses": pauses, "oob": True}
    return Frames(
        badge=render_to_string(BADGE_TEMPLATE, ctx).strip(),
        panel=render_to_string(PANEL_TEMPLATE, ctx).strip(),
        banner=render_to_string(BANNER_TEMPLATE, ctx).strip(),
        key=(tuple(attention.items), tuple(p["wording"] for p in pauses)),
        read_at=read_at,
    )


class SharedAttention:
    """The latest rendered read of one process, shared by its viewers: a new read only when the
    last one is older than what the caller asks for *and* at least ``min_seconds`` old.
    Thread-safe (viewers call it from the database threads of ``database_sync_to_async``)."""

    def __init__(self, read=read_and_render, min_seconds: float = ATTENTION_MIN_SECONDS):
        self._read = read
        self._min = min_seconds
        self._lock = threading.Lock()
        self._frames: Frames | None = None

    def get(self, not_before: float) -> Frames:
        """The frames of a read started at or after ``not_before`` (``time.monotonic()``) when one
        may be made now; else the latest (``read_at < not_before``: the caller asks again later).
        Raises what the read raises."""
        with self._lock:
            frames = self._frames
            started = time.monotonic()
            if frames is None or (frames.read_at < not_before and started - frames.read_at >= self._min):
                frames = self._frames = self._read(started)
            return frames


SHARED = SharedAttention()
