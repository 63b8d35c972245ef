"""Synchronous pushes (heartbeat rows, events, progress) share one Redis connection per process:
the channel layer keeps a connection per event loop, and the pushes run on one loop that lives as
long as the process, so a heartbeat does not open a connection."""

from __future__ import annotations

from redis.asyncio.connection import AbstractConnection

from live.publish import publish_rows, rows_notice
from live.rows import AGENTS_GROUP


def test_twenty_pushes_open_no_new_connection(monkeypatch):
    publish_rows([(AGENTS_GROUP, rows_notice("agents", ["warm-up"]))])  # the loop's first connection
    opened = []
    connect = AbstractConnection.connect

    async def counted(self, *args, **kwargs):
        if not self.is_connected:
            opened.append(self)
        return await connect(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "connect", counted)
    for n in range(20):
        publish_rows([(AGENTS_GROUP, rows_notice("agents", [f"agent-{n}"]))])
    assert opened == []
