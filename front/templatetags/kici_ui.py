"""Template helpers for the console pages: byte sizes, percentages, relative times, label chips,
code spans."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache
from urllib.parse import quote

from django import template
from django.conf import settings
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.http import RFC3986_SUBDELIMS
from django.utils.safestring import SafeString, mark_safe

from agents.choices import EVENT_BADGES, AgentState
from agents.liveness import WATCHED_STATES, current_mark, heartbeat_timeout_seconds
from lib.units import format_age, format_bytes_iec, format_duration
from lib.wording import visible_text
from scalers.holds import ARMABLE_STATES, hold_wording, is_armed
from scalers.kici_agents import KICI_ACTIVITY
from scalers.spawn_trace import waterfall

register = template.Library()

_CODE_SPAN = re.compile(r"`([^`]+)`")


@register.filter
def code_spans(text: str) -> SafeString:
    """``text`` escaped, each `span` in backticks (the CommonMark of OpenAPI descriptions) as
    ``<code>``; nothing else of Markdown is read."""
    return mark_safe(_CODE_SPAN.sub(r"<code>\1</code>", escape(text)))  # escaped first: safe


@register.filter
def bytes_iec(value) -> str:
    """Format a byte count with binary units (``lib.units.format_bytes_iec``)."""
    return format_bytes_iec(value)


@register.filter
def duration(value) -> str:
    """Seconds as the two largest units (``lib.units.format_duration``): ``7200`` → ``2h 0m``."""
    return format_duration(value)


@register.filter
def cpus(value) -> str:
    """Format a CPU count without noise: ``2.0`` → ``"2"``, ``0.25`` → ``"0.25"``; ``None`` → ``"—"``."""
    if value is None or value == "":
        return "—"
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


@register.simple_tag
def pct(part, whole) -> float:
    """``part`` as a percentage of ``whole``, clamped to 0-100 for bar widths; 0 when ``whole`` is 0/None."""
    try:
        part, whole = float(part or 0), float(whole or 0)
    except (TypeError, ValueError):
        return 0.0
    if whole <= 0:
        return 0.0
    return round(max(0.0, min(100.0, 100.0 * part / whole)), 1)


@register.simple_tag
def rel_time(value: datetime | None, empty: str = "—"):
    """``<time data-rel>`` showing "12s ago" (ticking in the browser: kici.js), absolute UTC in the title."""
    if not value:
        return format_html('<span class="muted">{}</span>', empty)
    return _rel_time(value, "")


def _rel_time(value: datetime, extra: str) -> SafeString:
    """``extra``: attributes made by the caller, safe. Every other part is digits, letters and
    punctuation this function writes (two per row of a table: no ``format_html`` escaping)."""
    iso, title = value.isoformat(), value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    age = format_age((timezone.now() - value).total_seconds())
    return mark_safe(f'<time data-rel datetime="{iso}" title="{title}"{extra}>{age}</time>')


def heartbeat_thresholds() -> tuple[int, int]:
    """``(amber, red)`` in seconds: a heartbeat older than two heartbeat intervals
    (``KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS``) is late, one older than
    ``KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS`` makes the agent lost (``agents.liveness``)."""
    return 2 * settings.KICI_AGENT_HEARTBEAT_INTERVAL_SECONDS, heartbeat_timeout_seconds()


@register.simple_tag
def heartbeat_age(agent):
    """The agent's last heartbeat as :func:`rel_time`. While heartbeats are expected (running,
    draining) it carries ``data-warn-after`` / ``data-late-after`` (seconds, see
    :func:`heartbeat_thresholds`) and the class ``age-ok``, ``age-warn`` (amber) or ``age-late``
    (red); kici.js moves the class on as the age ticks. An ended agent's (``Agent.is_ended``) is
    a fixed :func:`abs_time`: no heartbeat will come, and an age counting up reads as a live agent."""
    value = agent.last_heartbeat
    if not value:
        return format_html('<span class="muted">{}</span>', "never")
    if agent.is_ended:
        return abs_time(value)
    if agent.state not in WATCHED_STATES:
        return _rel_time(value, "")
    warn, late = heartbeat_thresholds()
    age = (timezone.now() - value).total_seconds()
    level = "age-late" if age > late else "age-warn" if age > warn else "age-ok"
    return _rel_time(value, f' class="{level}" data-warn-after="{warn}" data-late-after="{late}"')


@register.simple_tag
def abs_time(value: datetime | None, empty: str = "—"):
    """An absolute timestamp in UTC, saying so (``2026-11-29 16:55:03 UTC``), in a ``<time>`` element."""
    if not value:
        return format_html('<span class="muted">{}</span>', empty)
    return format_html(
        '<time datetime="{}">{} UTC</time>',
        value.isoformat(),
        value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
    )


@register.simple_tag
def agent_address(agent):
    """The agent's address: its current one (``Agent.current_ip``); an ended agent's last one,
    marked released, never as current (the next agent may hold it now); "—" when it had none."""
    if agent.current_ip:
        return agent.current_ip
    if agent.ip:
        return format_html(
            '<span class="muted" data-released title="{}">{} (released)</span>',
            "its last address, released when it ended: another agent may hold it now",
            agent.ip,
        )
    return "—"


@register.filter
def declared_labels(labels) -> list[str]:
    """The labels without the automatic ``kici:`` ones (added to every agent), for compact tables."""
    return [label for label in (labels or []) if not str(label).startswith("kici:")]


@register.filter
def visible(text) -> str:
    """Text an agent, its sandbox or the orchestrator supplied (event details, failure reasons,
    job ids) with what cannot be seen escaped (``lib.wording.visible_text``: ``\\u202e``); then
    autoescaped as any value."""
    return visible_text("" if text is None else str(text))


@register.filter
def first_line(text: str) -> str:
    """The first line of a multi-line text (failure details carry captured output after it)."""
    return (text or "").split("\n", 1)[0]


@register.filter
def rest_lines(text: str) -> str:
    """Everything after the first line, or ``""``."""
    parts = (text or "").split("\n", 1)
    return parts[1] if len(parts) > 1 else ""


@register.filter
def spawn_waterfall(agent):
    """The bars of ``agent``'s spawn trace (``scalers.spawn_trace.waterfall``), [] when it has none. No query."""
    return waterfall(agent.spawn_trace)


@register.filter
def lost_mark(agent):
    """The lost-agents sweep's mark on ``agent`` while it still holds (``agents.liveness.current_mark``:
    ``{"lost_by", "sandbox", "reasons", "operation", "at", "heartbeat_at"}``), else None. No query."""
    return current_mark(agent)


@register.filter
def kici_activity(agent) -> dict | None:
    """What the KiCI agent's own log says it does (``backend_context["kici_activity"]``:
    ``{"state", "jobId", "runId"}``), or None. No query; a template's lookup of a missing key costs
    three caught exceptions per row."""
    return (agent.backend_context or {}).get(KICI_ACTIVITY)


@register.filter
def hold_text(agent) -> str:
    """Who holds (or armed a hold on) ``agent``, why and until when (``scalers.holds.hold_wording``),
    while it is held or its hold armed; "" otherwise. No query."""
    return hold_wording(agent) if agent.state == AgentState.HELD or hold_armed(agent) else ""


@register.filter
def hold_armed(agent) -> bool:
    """An operator's hold waits for ``agent``'s end, which has not come (``scalers.holds.is_armed``).
    No query."""
    return agent.state in ARMABLE_STATES and is_armed(agent)


@register.filter
def event_badge(event_type: str) -> str:
    """CSS badge class for an event type (failed red, ready/registered green, others blue)."""
    return EVENT_BADGES.get(event_type, "b-blue")


_PLACEHOLDER = "0kiciplaceholder0"


@lru_cache(maxsize=64)
def _url_pattern(name: str, urlconf: str | None, prefix: str) -> str:
    return reverse(name, args=[_PLACEHOLDER], urlconf=urlconf)


@register.simple_tag
def url_for(name: str, value) -> str:
    """``{% url name value %}`` for a one-argument route, resolved once per route instead of per
    row (a table of agents has several links per row, and ``reverse`` is slow). ``value`` is
    percent-quoted as ``reverse`` would."""
    pattern = _url_pattern(name, get_urlconf(), get_script_prefix())
    return pattern.replace(_PLACEHOLDER, quote(str(value), safe=RFC3986_SUBDELIMS + "~:@"))
