"""The gateway's heartbeats, written in batches: each gateway process writes its heartbeats on its
own event loop over one persistent connection of its own, and the beats that arrive while a
statement is in flight are written together by the next one (``agents.heartbeats.beats_statement``,
the same statement and checks as the Django view's one beat). A beat the statement does not write,
or any beat while the database fails, is answered None: the caller hands it to the Django view,
which writes or refuses it itself. Why: docs/serving.md ("One heartbeat").
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
from django.db import connections
from django.utils import timezone

from .heartbeats import beats_statement, push_committed_heartbeat_row
from .tokens import SESSION_PREFIX, hash_token

log = logging.getLogger(__name__)

#: Most beats one statement writes; more wait for the next statement.
MAX_BATCH = 500
#: Seconds after a failed connection or statement during which beats are answered None at once
#: (the view writes them on its own connections), before the connection is tried again.
RETRY_SECONDS = 1.0
#: Seconds a connection attempt may take (libpq's ``connect_timeout``; it takes whole seconds).
CONNECT_TIMEOUT_SECONDS = 2
#: Seconds a statement may wait for a row lock, and run in all, on the server; and the client's
#: own bound on a statement's round trip, for a server that does not answer at all.
LOCK_TIMEOUT_SECONDS = 2.0
STATEMENT_TIMEOUT_SECONDS = 5.0
#: ``application_name`` of the batcher's connection (pg_stat_activity shows it).
APPLICATION_NAME = "kici-heartbeat-batch"

type _Key = tuple[str, str]  # (token hash, agent id)


def connection_params(alias: str = "default") -> dict:
    """psycopg connection parameters for Django's database ``alias`` (``DATABASES``: name, user,
    password, host, port, ``OPTIONS``), without what belongs to Django's own connections (its
    cursor class, adapters and pool); the statement is prepared after psycopg's usual five runs."""
    params = connections[alias].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return params


class HeartbeatBatcher:
    """One process's heartbeat writer (module doc). Use it from one event loop; the writer task
    and the connection are made on first use. ``params``: psycopg connection parameters, by
    default :func:`connection_params`."""

    def __init__(self, params: dict | None = None):
        self._params = params
        self._queue: list[tuple[str, str, int | None, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None
        self._connection: psycopg.AsyncConnection | None = None
        self._down_until = float("-inf")

    async def beat(self, raw: str, agent_id: str, active_jobs: int | None) -> str | None:
        """Write a heartbeat of ``agent_id`` authenticated by the session token ``raw`` (and
        ``active_jobs``, None to keep the stored count) with the beats queued beside it. Returns
        the agent's state once written, or None when it was not: not a session token, refused by
        the statement's checks, or the database failed (then for :data:`RETRY_SECONDS` every beat
        is answered None at once)."""
        if not raw.startswith(SESSION_PREFIX) or time.monotonic() < self._down_until:
            return None
        future = asyncio.get_running_loop().create_future()
        self._queue.append((hash_token(raw), agent_id, active_jobs, future))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())
        return await future

    async def _write_queued(self) -> None:
        """Write batches until none is queued: what queued meanwhile goes in the next one."""
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._write(batch)
        finally:
            self._writer = None
            for *_, future in self._queue:  # left only when a batch raised: not written here
                if not future.done():
                    future.set_result(None)
            self._queue = []

    async def _write(self, batch: list[tuple[str, str, int | None, asyncio.Future]]) -> None:
        """One statement for ``batch``; every beat's future gets its state or None. Beats of one
        token and agent are one row of the statement (the last ``active_jobs`` given counts, as
        if they had been written one after another)."""
        futures: dict[_Key, list[asyncio.Future]] = {}
        active: dict[_Key, int | None] = {}
        for token_hash, agent_id, jobs, future in batch:
            key = (token_hash, agent_id)
            futures.setdefault(key, []).append(future)
            if jobs is not None or key not in active:
                active[key] = jobs
        keys = list(futures)
        written: dict[int, tuple[str, int]] = {}
        try:
            if time.monotonic() >= self._down_until:  # else queued before the last batch failed
                sql, params = beats_statement([(*key, active[key]) for key in keys], timezone.now())
                written = {i: (state, scaler_id) for i, _pk, state, scaler_id in await self._execute(sql, params)}
        except (psycopg.Error, OSError) as exc:  # TimeoutError is an OSError
            log.warning("heartbeat batch of %d not written (the view writes them): %s", len(batch), exc)
            self._down_until = time.monotonic() + RETRY_SECONDS
            await self._close()
        finally:
            for i, key in enumerate(keys, 1):
                state, scaler_id = written.get(i, (None, 0))
                if state is not None:
                    push_committed_heartbeat_row(key[1], scaler_id)
                for future in futures[key]:
                    if not future.done():  # its request may have been cancelled meanwhile
                        future.set_result(state)

    async def _execute(self, sql: str, params: tuple) -> list[tuple]:
        """The rows of ``sql`` run on the batcher's connection, connecting first when it has none.
        Raises psycopg.Error, OSError, or TimeoutError after :data:`STATEMENT_TIMEOUT_SECONDS`
        and a second without an answer."""
        async with asyncio.timeout(STATEMENT_TIMEOUT_SECONDS + CONNECT_TIMEOUT_SECONDS + 1):
            if self._connection is None or self._connection.closed:
                self._connection = await self._connect()
            cursor = await self._connection.execute(sql, params)
            return await cursor.fetchall()

    async def _connect(self) -> psycopg.AsyncConnection:
        """A connection in autocommit, whose every transaction is one batch: no wait for the WAL
        flush at its commit (what a crash of PostgreSQL loses, the agents' next beats restore),
        and bounded waits for a row lock and for the statement."""
        params = self._params if self._params is not None else connection_params()
        connection = await psycopg.AsyncConnection.connect(
            **{"connect_timeout": CONNECT_TIMEOUT_SECONDS, **params, "application_name": APPLICATION_NAME},
            autocommit=True,
        )
        await connection.execute(
            "SELECT set_config('synchronous_commit', 'off', false), set_config('lock_timeout', %s, false), "
            "set_config('statement_timeout', %s, false)",
            (f"{LOCK_TIMEOUT_SECONDS * 1000:.0f}", f"{STATEMENT_TIMEOUT_SECONDS * 1000:.0f}"),
        )
        return connection

    async def _close(self) -> None:
        """Drop the connection (the next batch connects afresh)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except (psycopg.Error, OSError) as exc:
                log.debug("closing the heartbeat batch connection: %s", exc)
