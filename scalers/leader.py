"""Which console process leads the sweeps: a PostgreSQL session advisory lock held by
:class:`Leadership` on a dedicated psycopg connection (Django may close its own between units of
work), so the lock lives exactly as long as that connection; TCP keepalives (:data:`KEEPALIVE_OPTIONS`)
end a vanished host's session within :data:`DEAD_PEER_SECONDS`. Failover cases: docs/recovery.md
("Leader failover").
"""

from __future__ import annotations

import logging
import zlib

import psycopg
from django.conf import settings
from django.db import connections

log = logging.getLogger(__name__)

#: Advisory lock key (int64): "kici" in ASCII, then 1 for the sweeper.
LEADER_LOCK_KEY = 0x6B696369_00000001
#: High half of the host lock keys ("kich"); the low half is the CRC-32 of the host name.
HOST_LOCK_PREFIX = 0x6B696368
#: ``application_name`` prefix of every sweeper's dedicated session, then its instance id: the
#: sessions in ``pg_stat_activity`` are the consoles alive now (:func:`connected_instances`).
SESSION_PREFIX = "kici-scaler-leader:"
#: TCP keepalive of the lock session, seconds: first probe after this much silence, then one per
#: interval, the peer given up after ``count`` unanswered ones (also the unacknowledged-data bound).
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 2, 1, 3
#: seconds within which either end of the lock session notices the other host is gone
DEAD_PEER_SECONDS = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT
#: libpq parameters (the client's socket) and server settings (PostgreSQL's socket) of the lock
#: session; PostgreSQL ignores its side on a Unix socket, where a dead peer is seen at once.
KEEPALIVE_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE,
    "keepalives_interval": KEEPALIVE_INTERVAL,
    "keepalives_count": KEEPALIVE_COUNT,
    "tcp_user_timeout": DEAD_PEER_SECONDS * 1000,
    "options": (
        f"-c tcp_keepalives_idle={KEEPALIVE_IDLE} -c tcp_keepalives_interval={KEEPALIVE_INTERVAL}"
        f" -c tcp_keepalives_count={KEEPALIVE_COUNT} -c tcp_user_timeout={DEAD_PEER_SECONDS * 1000}"
    ),
}


def host_lock_key(host: str) -> int:
    """The advisory lock key of ``host``'s sweepers: the one holding it runs the host's own units,
    so two sweepers started on one host never both run them (docs/multi-host.md)."""
    return (HOST_LOCK_PREFIX << 32) | zlib.crc32(host.encode())


def session_name(instance_id: str) -> str:
    """The ``application_name`` of ``instance_id``'s sweeper session (PostgreSQL keeps 63 bytes)."""
    return f"{SESSION_PREFIX}{instance_id}"[:63]


def connected_instances(cursor) -> set[str]:
    """Instance ids of the consoles whose sweeper holds a session on this database now, leading
    or not (``cursor``: any cursor on the same database). Raises the driver's error when the
    catalog cannot be read."""
    cursor.execute(
        "SELECT DISTINCT substr(application_name, %s) FROM pg_stat_activity "
        "WHERE datname = current_database() AND starts_with(application_name, %s)",
        [len(SESSION_PREFIX) + 1, SESSION_PREFIX],
    )
    return {row[0] for row in cursor.fetchall() if row[0]}


def _conninfo(alias: str = "default") -> dict:
    """Connection parameters of the lock session: Django's database ``alias`` (its current name,
    the test database in tests), this instance's session name and :data:`KEEPALIVE_OPTIONS`."""
    db = connections[alias].settings_dict
    info = {"dbname": db["NAME"], "application_name": session_name(settings.KICI_INSTANCE_ID), **KEEPALIVE_OPTIONS}
    for key, name in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host"), ("PORT", "port")):
        if db.get(key):
            info[name] = str(db[key])
    return info


class Leadership:
    """Hold or seek the sweeper lock. ``poll()`` → ``(is_leader, became_leader)``.

    ``key``: the advisory lock key (:data:`LEADER_LOCK_KEY`, or a host's :func:`host_lock_key`);
    ``what``: what holding it means, for the log. ``alias``: Django database alias whose settings
    are used. ``release()`` drops leadership and closes the dedicated connection.
    """

    def __init__(self, key: int = LEADER_LOCK_KEY, alias: str = "default", what: str = "the scaler sweeps"):
        self.key = key
        self.alias = alias
        self.what = what
        self._conn: psycopg.Connection | None = None
        self.is_leader = False

    def _connect(self) -> psycopg.Connection:
        return psycopg.connect(autocommit=True, connect_timeout=5, **_conninfo(self.alias))

    def poll(self) -> tuple[bool, bool]:
        """Check (or try to take) leadership. Never raises; a database error means "not leader"."""
        if self.is_leader and self._conn is not None:
            try:
                self._conn.execute("SELECT 1")
                return True, False
            except Exception as exc:  # noqa: BLE001
                log.warning("lost the lead of %s: %s", self.what, exc)
                self._drop()
                return False, False
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()
        except Exception as exc:  # noqa: BLE001
            log.warning("cannot reach the database to seek the lead of %s: %s", self.what, exc)
            self._drop()
            return False, False
        if row and row[0]:
            self.is_leader = True
            log.info("this process now leads %s", self.what)
            return True, True
        return False, False

    def _drop(self) -> None:
        self.is_leader = False
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
        self._conn = None

    def release(self) -> None:
        """Give leadership up (unlock, close the connection)."""
        if self._conn is not None and self.is_leader:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", [self.key])
            except Exception:  # noqa: BLE001
                pass
        self._drop()
