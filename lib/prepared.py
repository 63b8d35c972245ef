"""Server-side prepared statements, ``PREPARE``d once per physical connection.

Django's cursors bind on the client and psycopg prepares nothing under Django (``prepare_threshold``
None), so PostgreSQL parses and plans every statement it is sent. A hot statement is prepared here
with SQL-level ``PREPARE`` on the raw psycopg connection and run as ``EXECUTE <name>(...)``.
Prepared statements belong to the session: a rolled back transaction keeps them, a pooled
connection keeps them for the next borrower, and ``DISCARD ALL`` or ``DEALLOCATE`` drops them
(then :func:`forget` the connection and prepare again)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import psycopg

#: The statement names prepared on each raw connection (a closed connection's entry goes with it).
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection, set[str]] = weakref.WeakKeyDictionary()


def prepare_once(conn: psycopg.Connection, statements: Mapping[str, str]) -> None:
    """``PREPARE`` each of ``statements`` (name to text, parameters as ``$1``...) on ``conn``, a raw
    psycopg connection, unless this process already did: then this costs a dictionary lookup.
    The first time, the ones the session already has (a ``PREPARE`` cut short) are left as they
    are. Runs in ``conn``'s transaction if it is in one. Raises ``psycopg.Error``."""
    done = _PREPARED.get(conn)
    if done is not None and done.issuperset(statements):
        return
    with psycopg.Cursor(conn) as cur:
        cur.execute("SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)", [list(statements)])
        have = {row[0] for row in cur.fetchall()}
        for name, text in statements.items():
            if name not in have:
                cur.execute(f"PREPARE {name} AS {text}")
    _PREPARED.setdefault(conn, set()).update(statements)


def forget(conn: psycopg.Connection, names: Iterable[str] = ()) -> None:
    """Forget what :func:`prepare_once` prepared on ``conn`` and ``DEALLOCATE`` those of ``names``
    the session still has (after an ``EXECUTE`` found its statement gone or invalid: a statement
    invalidated by a schema change keeps failing until it is prepared anew). The next
    :func:`prepare_once` checks the session again. Raises ``psycopg.Error``."""
    _PREPARED.pop(conn, None)
    if names := list(names):
        with psycopg.Cursor(conn) as cur:
            cur.execute("SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)", [names])
            for (name,) in cur.fetchall():
                cur.execute(f"DEALLOCATE {name}")


def statement_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (a psycopg error, or Django's wrapper of one) says an ``EXECUTE``'s prepared
    statement is gone (``DISCARD ALL``, ``DEALLOCATE``) or no longer fits the schema ("cached plan
    must not change result type"): preparing it again mends that."""
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return isinstance(cause, psycopg.errors.InvalidSqlStatementName | psycopg.errors.FeatureNotSupported)
