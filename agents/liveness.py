"""When is an agent lost? The rule, as pure logic over one agent row and one sandbox probe: a
``running`` or ``draining`` agent whose sandbox is provably gone (``lost_by`` ``sandbox``) or whose
heartbeat is older than ``settings.KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS``, counted from the console's
last boot at the earliest (``heartbeat``). Nothing here touches docker or the database. The rule
and why: docs/lost-agents.md ("The rule").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

#: Agent states in which an agent can be lost (registered, holding a slot).
WATCHED_STATES = ("running", "draining")
#: Sandbox states that prove the sandbox is gone (``missing``: absent from a listing that worked).
GONE_SANDBOX_STATES = frozenset({"missing", "exited", "dead", "removing"})
#: Sandbox states that prove nothing: the probe could not look, or the backend has none to probe.
UNKNOWN_SANDBOX_STATES = frozenset({"unknown", "not probed"})


def heartbeat_timeout_seconds() -> int:
    """``settings.KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS`` (seconds)."""
    from django.conf import settings

    return int(settings.KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS)


def heartbeat_key(value: datetime | None) -> str | None:
    """The last heartbeat as stored in evidence and marks (ISO 8601), None when there is none."""
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class Liveness:
    """The verdict on one agent.

    ``heartbeat_age_seconds``: seconds since the last heartbeat (None: never beat).
    ``silent_seconds``: seconds the console could have heard it and did not (from ``since``).
    ``sandbox``: ``running``, ``exited``, ``missing``, ``dead``, ``unknown``, ``not probed``...;
    ``reasons``: one line per piece of evidence, for people.
    """

    lost: bool
    lost_by: str | None  # "sandbox" | "heartbeat" | None
    heartbeat_age_seconds: int | None
    silent_seconds: int
    heartbeat_overdue: bool
    sandbox: str
    sandbox_detail: str
    reasons: tuple[str, ...]

    @property
    def sandbox_gone(self) -> bool:
        return self.sandbox in GONE_SANDBOX_STATES


def _age(since: datetime | None, now: datetime) -> int | None:
    return None if since is None else max(0, int((now - since).total_seconds()))


def assess(
    state: str,
    last_heartbeat: datetime | None,
    sandbox: str,
    *,
    now: datetime,
    timeout_seconds: int,
    since: datetime | None = None,
    sandbox_detail: str = "",
    what: str = "sandbox",
) -> Liveness:
    """Decide whether an agent in ``state`` is lost (the module doc's rule).

    ``last_heartbeat``: the row's ``last_heartbeat`` (registration sets it), else its registration
    or creation time; ``since``: the console's last boot (None: unknown), the silence is counted
    from ``max(last_heartbeat, since)``; ``sandbox``: the probe's state; ``what``: the sandbox's
    name in the reasons (``container``, ``VM``, ``process``).
    """
    age = _age(last_heartbeat, now)
    heard_from = max(d for d in (last_heartbeat, since) if d is not None) if (last_heartbeat or since) else None
    silent = _age(heard_from, now) or 0
    overdue = state in WATCHED_STATES and silent > timeout_seconds
    gone = state in WATCHED_STATES and sandbox in GONE_SANDBOX_STATES
    reasons = []
    if gone:
        reasons.append(f"{what} {sandbox}" + (f" ({sandbox_detail})" if sandbox_detail else ""))
    if overdue:
        heard = "never" if age is None else f"{age}s ago"
        reasons.append(f"no heartbeat for {silent}s (last {heard}; timeout {timeout_seconds}s)")
    lost_by = "sandbox" if gone else "heartbeat" if overdue else None
    return Liveness(
        lost=lost_by is not None,
        lost_by=lost_by,
        heartbeat_age_seconds=age,
        silent_seconds=silent,
        heartbeat_overdue=overdue,
        sandbox=sandbox,
        sandbox_detail=sandbox_detail,
        reasons=tuple(reasons),
    )


def current_mark(agent) -> dict | None:
    """The lost mark the last lost-agents sweep left on ``agent`` (``agent.lost``), or None when it
    no longer holds: the agent left running/draining, or it heartbeated since the mark was made.

    The mark is ``{"at", "heartbeat_at", "lost_by", "sandbox", "reasons": [...], "operation"}``
    (see ``operations.kinds.lost_agents.observe``). No query: reads the row only.
    """
    mark = getattr(agent, "lost", None) or None
    if not mark or agent.state not in WATCHED_STATES:
        return None
    if mark.get("heartbeat_at") != heartbeat_key(agent.last_heartbeat):
        return None
    return mark
