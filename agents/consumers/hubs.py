"""This process's console hub, one per event loop, on the Redis channel layer (issue 7)."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from django.conf import settings

from live.hub import ConsoleHub
from live.transport import RedisTransport

_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def get_console_hub() -> ConsoleHub:
    """This process's hub (one per event loop) on the Redis layer ``settings.CHANNEL_LAYERS``.

    Its :class:`live.transport.RedisTransport` also carries the event groups. Call from a
    coroutine.
    """
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        import redis.asyncio
        from channels.layers import get_channel_layer

        transport = RedisTransport(get_channel_layer(), redis.asyncio.from_url(settings.REDIS_URL))
        hub = ConsoleHub(transport)
        _hubs[loop] = hub
    return hub


async def close_console_hub() -> None:
    """Stop this loop's hub, its pumps and its relay channel (tests, shutdown)."""
    hub = _hubs.pop(asyncio.get_running_loop(), None)
    if hub is None:
        return
    await hub.aclose()
    await hub.transport.aclose()
    with contextlib.suppress(Exception):
        await hub.transport.redis.aclose()
