"""Live row updates for heartbeats: a heartbeat stores no event, so each marks its agent's row as
changed and the marks go out together, at most one push every :data:`ROW_PUSH_GAP_SECONDS`, to
the pages showing the agents (why and how: docs/serving.md, "One heartbeat").
"""

from __future__ import annotations

import os
import threading
import time
from functools import cache

from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from .choices import TERMINAL_STATES
from .events import push_after_commit
from .models import Agent, AgentToken
from .tokens import SESSION_PREFIX, hash_token

#: Sent on the event publisher thread when agents' rows changed without an event (heartbeats,
#: admissions): ``rows``, a dict of ``agent_id`` (str) to the scaler's pk, and ``scalers``, the pks
#: of the scalers whose capacity changed too (admissions); ``live.apps`` connects the push.
agent_rows_changed = Signal()

#: Seconds after which a batch handed to the publisher and never sent (its backlog was full) is
#: given up and a new one handed over.
_LOST_BATCH_SECONDS = 10.0
#: Least seconds between two pushes of marked rows: a push waits out the rest on the publisher
#: thread, gathering the marks of that time into it. Pages show the rows at most once a second
#: (``live.rows``); a push costs about a millisecond of CPU, a heartbeat's own work about as much.
ROW_PUSH_GAP_SECONDS = 0.25


class _Marks:
    """The agent rows marked since the last push, and whether a push of them is queued."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """No marks and a fresh lock (also in a forked child, whose copy of the lock may be held)."""
        self.lock = threading.Lock()
        self.rows: dict[str, int] = {}
        self.scalers: set[int] = set()
        self.queued_at: float | None = None
        self.sent_at = float("-inf")

    def mark(self, agent_id: str, scaler_id: int, *, capacity: bool = False) -> None:
        with self.lock:
            self.rows[agent_id] = scaler_id
            if capacity:
                self.scalers.add(scaler_id)
            now = time.monotonic()
            if self.queued_at is not None and now - self.queued_at < _LOST_BATCH_SECONDS:
                return
            self.queued_at = now
        push_after_commit(self.send)

    def send(self) -> None:
        wait = self.sent_at + ROW_PUSH_GAP_SECONDS - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with self.lock:
            rows, scalers = self.rows, self.scalers
            self.rows, self.scalers, self.queued_at = {}, set(), None
            self.sent_at = time.monotonic()
        if rows:
            agent_rows_changed.send(sender=Agent, rows=rows, scalers=scalers)


_MARKS = _Marks()
# A forked rq work-horse starts with no marks and a fresh lock.
os.register_at_fork(after_in_child=_MARKS.reset)


def store_heartbeat(agent: Agent, active_jobs: int | None) -> None:
    """Record a heartbeat of ``agent`` (only ``pk``, ``agent_id`` and ``scaler_id`` are read):
    ``last_heartbeat`` now and, when given, ``active_jobs``, in one statement without waiting for
    its WAL flush (docs/serving.md says why that is safe); then mark its row for the open pages.
    Raises ``DatabaseError``."""
    with connection.cursor() as cursor:
        # Two statements in one query string: PostgreSQL runs them as one implicit transaction.
        cursor.execute(
            f"SET LOCAL synchronous_commit TO OFF; UPDATE {Agent._meta.db_table} "
            "SET last_heartbeat = %s, active_jobs = COALESCE(%s, active_jobs) WHERE id = %s",
            (timezone.now(), active_jobs, agent.pk),
        )
    push_heartbeat_row(agent)


@cache
def _beat_sql() -> str:
    """The statement of :func:`beat_with_session` (no commit wait, then the guarded update)."""
    return (
        f"SET LOCAL synchronous_commit TO OFF; UPDATE {Agent._meta.db_table} a "
        "SET last_heartbeat = %s, active_jobs = COALESCE(%s, a.active_jobs) "
        f"FROM {AgentToken._meta.db_table} t WHERE t.token_hash = %s AND t.agent_id = a.id "
        "AND t.expires_at > %s AND a.agent_id = %s AND NOT (a.state = ANY(%s)) "
        "RETURNING a.id, a.state, a.scaler_id"
    )


def beat_with_session(raw: str, agent_id: str, active_jobs: int | None) -> Agent | None:
    """Record a heartbeat of ``agent_id`` authenticated by the session token ``raw`` in one
    statement: written only when ``raw`` is ``agent_id``'s known, unexpired session token and the
    agent has not ended. Returns the agent (``pk``, ``agent_id``, ``state``, ``scaler_id`` set), or
    None when nothing was written (``agents.tokens.authenticate_session`` then says why). Raises
    ``DatabaseError``."""
    if not isinstance(raw, str) or not raw.startswith(SESSION_PREFIX):
        return None
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_beat_sql(), (now, active_jobs, hash_token(raw), now, agent_id, list(TERMINAL_STATES)))
        cursor.nextset()  # past the SET's result, to the UPDATE's
        row = cursor.fetchone()
    if row is None:
        return None
    agent = Agent(pk=row[0], agent_id=agent_id, state=row[1], scaler_id=row[2])
    push_heartbeat_row(agent)
    return agent


def push_heartbeat_row(agent: Agent) -> None:
    """Mark ``agent``'s row as changed once the current transaction commits; the marks go out in
    order with the event pushes, several agents at once. Needs only ``agent.agent_id`` and
    ``agent.scaler_id``: no query."""
    agent_id, scaler_id = agent.agent_id, agent.scaler_id
    transaction.on_commit(lambda: _MARKS.mark(agent_id, scaler_id))


def push_admitted_row(agent_id: str, scaler_id: int) -> None:
    """Mark a newly admitted agent's row (and its scaler's capacity) as changed once the current
    transaction commits: admission stores no event, and an agent waiting for a spawn slot records
    none until it gets one, yet it holds a reservation and counts on every list."""
    transaction.on_commit(lambda: _MARKS.mark(agent_id, scaler_id, capacity=True))
