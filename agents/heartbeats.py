"""Live row updates for heartbeats: a heartbeat stores no event, so each marks its agent's row as
changed and the marks go out together, at most one push every :data:`ROW_PUSH_GAP_SECONDS`, to
the pages showing the agents (why and how: docs/serving.md, "One heartbeat").
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from functools import cache

from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from .choices import TERMINAL_STATES
from .events import push_committed
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
        """Mark a row whose change is committed; queue a push of the marks unless one is queued.
        No database access: safe on an event loop (the lock is held for a few statements)."""
        with self.lock:
            self.rows[agent_id] = scaler_id
            if capacity:
                self.scalers.add(scaler_id)
            now = time.monotonic()
            if self.queued_at is not None and now - self.queued_at < _LOST_BATCH_SECONDS:
                return
            self.queued_at = now
        push_committed(self.send)

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
def _beats_sql() -> str:
    """The text of :func:`beats_statement` (constant, whatever the number of beats)."""
    return (
        f"UPDATE {Agent._meta.db_table} a "
        "SET last_heartbeat = %s, active_jobs = COALESCE(v.active, a.active_jobs) "
        "FROM unnest(%s::text[], %s::text[], %s::integer[]) WITH ORDINALITY AS v(token_hash, agent_id, active, i) "
        f"JOIN {AgentToken._meta.db_table} t ON t.token_hash = v.token_hash "
        "WHERE t.agent_id = a.id AND t.expires_at > %s AND a.agent_id = v.agent_id "
        "AND NOT (a.state = ANY(%s::text[])) "
        "RETURNING v.i, a.id, a.state, a.scaler_id"
    )


def beats_statement(beats: Sequence[tuple[str, str, int | None]], now: datetime) -> tuple[str, tuple]:
    """The one statement that writes heartbeats, as ``(sql, params)`` with ``%s`` placeholders:
    ``beats`` are ``(token_hash, agent_id, active_jobs)`` (``hash_token`` of the session token,
    the URL's agent, None to keep the stored count), no two with the same token hash and agent.
    A beat is written (``last_heartbeat = now``, ``active_jobs`` when given) only when its hash is
    a known session token, unexpired at ``now``, of the agent ``agent_id``, and that agent has not
    ended; those checks are the statement's ``WHERE``. Its rows are ``(i, pk, state, scaler_id)``
    of each beat written, ``i`` its 1-based place in ``beats``. Run it without waiting for its
    WAL flush (docs/serving.md, "One heartbeat")."""
    hashes, agent_ids, active = (list(column) for column in zip(*beats, strict=True)) if beats else ([], [], [])
    return _beats_sql(), (now, hashes, agent_ids, active, now, list(TERMINAL_STATES))


def beat_with_session(raw: str, agent_id: str, active_jobs: int | None) -> Agent | None:
    """Record a heartbeat of ``agent_id`` authenticated by the session token ``raw``: the one-beat
    use of :func:`beats_statement` on Django's connection, its commit not waiting for the WAL
    flush. Returns the agent (``pk``, ``agent_id``, ``state``, ``scaler_id`` set), or None when
    nothing was written (``agents.tokens.authenticate_session`` then says why). Raises
    ``DatabaseError``."""
    if not isinstance(raw, str) or not raw.startswith(SESSION_PREFIX):
        return None
    sql, params = beats_statement([(hash_token(raw), agent_id, active_jobs)], timezone.now())
    with connection.cursor() as cursor:
        # Two statements in one query string: PostgreSQL runs them as one implicit transaction.
        cursor.execute("SET LOCAL synchronous_commit TO OFF; " + sql, params)
        cursor.nextset()  # past the SET's result, to the UPDATE's
        row = cursor.fetchone()
    if row is None:
        return None
    agent = Agent(pk=row[1], agent_id=agent_id, state=row[2], scaler_id=row[3])
    push_heartbeat_row(agent)
    return agent


def push_heartbeat_row(agent: Agent) -> None:
    """Mark ``agent``'s row as changed once the current transaction commits; the marks go out in
    order with the event pushes, several agents at once. Needs only ``agent.agent_id`` and
    ``agent.scaler_id``: no query."""
    agent_id, scaler_id = agent.agent_id, agent.scaler_id
    transaction.on_commit(lambda: _MARKS.mark(agent_id, scaler_id))


def push_committed_heartbeat_row(agent_id: str, scaler_id: int) -> None:
    """Mark the row of a heartbeat already committed outside Django's transactions (the gateway's
    batches, ``agents.heartbeat_batch``). No database access: safe on an event loop."""
    _MARKS.mark(agent_id, scaler_id)


def push_admitted_row(agent_id: str, scaler_id: int) -> None:
    """Mark a newly admitted agent's row (and its scaler's capacity) as changed once the current
    transaction commits: admission stores no event, and an agent waiting for a spawn slot records
    none until it gets one, yet it holds a reservation and counts on every list."""
    transaction.on_commit(lambda: _MARKS.mark(agent_id, scaler_id, capacity=True))
