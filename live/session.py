"""Live sockets end with the session and the permission that opened them: a socket is
authenticated once, at its handshake, and what follows must not outlive the right to see it. Every
consumer binds itself (:class:`SessionBound`) to its session's group (a sign-out closes it at once)
and re-checks session and permission every :data:`SESSION_CHECK_SECONDS`. Close codes and what the
pages do with them: docs/browser-security.md ("Sockets end with the session").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from importlib import import_module

from asgiref.sync import async_to_sync
from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user, get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest

log = logging.getLogger(__name__)

CLOSE_SIGNED_OUT = 4401
CLOSE_FORBIDDEN = 4403

SESSION_CHECK_SECONDS = 3.0
"""Seconds between two re-checks of an open socket's session and permission."""


def session_group(session_key: str) -> str:
    """The Channels group of one session's sockets, named by a hash: the session key is a secret
    and Redis channel names are not."""
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:32]


def close_sockets_of(session_key: str | None) -> None:
    """Tell every socket of the session ``session_key`` to close (sync; a sign-out view)."""
    if not session_key:
        return
    try:
        async_to_sync(get_channel_layer().group_send)(session_group(session_key), {"type": "session.end"})
    except Exception:  # the periodic re-check closes them within seconds anyway
        log.warning("could not tell the sockets of a signed-out session to close", exc_info=True)


def on_logged_out(sender, request, user, **kwargs) -> None:
    """``user_logged_out`` receiver (connected in ``live.apps``); runs before the session is flushed."""
    session = getattr(request, "session", None)
    close_sockets_of(getattr(session, "session_key", None))


def session_verdict(session_key: str | None, user_pk, perm: str | None) -> int | None:
    """None while the socket may stay open, else its close code (module doc). ``session_key``
    None (a socket given a user without a session, in-process callers): only the user is checked."""
    user: AbstractBaseUser | AnonymousUser | None
    if session_key is not None:
        request = HttpRequest()  # get_user reads only its session
        request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        user = get_user(request)  # AnonymousUser unless the session still holds this user
    else:
        user = get_user_model().objects.filter(pk=user_pk).first()
    if user is None or not user.is_authenticated or user.pk != user_pk or not user.is_active:
        return CLOSE_SIGNED_OUT
    if perm and not user.has_perm(perm):
        return CLOSE_FORBIDDEN
    return None


class SessionBound(AsyncWebsocketConsumer):
    """Base of a Channels consumer: :meth:`bind_session` once it decided to accept,
    :meth:`unbind_session` in ``disconnect``. Ends the socket with the session (module doc)."""

    session_perm: str | None = None
    _session_group: str | None = None
    _session_watch: asyncio.Task | None = None

    async def send(self, text_data=None, bytes_data=None, close=False):
        """Send a frame; one racing the browser's leaving is dropped (daphne raises autobahn's
        ``Disconnected`` for it), as nobody is left to read it and ``disconnect`` follows."""
        try:
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except Disconnected:
            log.debug("a frame for a socket that just closed was dropped")

    async def close(self, code=None, reason=None):
        """Close the socket; a socket the browser closed already needs nothing more."""
        try:
            await super().close(code=code, reason=reason)
        except Disconnected:
            log.debug("a close for a socket that just closed was dropped")

    async def bind_session(self, perm: str | None) -> None:
        self.session_perm = perm
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        if key:
            self._session_group = session_group(key)
            await self.channel_layer.group_add(self._session_group, self.channel_name)
        user = self.scope.get("user")
        self._session_watch = asyncio.create_task(self._watch_session(key, getattr(user, "pk", None)))

    async def _watch_session(self, key: str | None, user_pk) -> None:
        try:
            while True:
                await asyncio.sleep(SESSION_CHECK_SECONDS)
                code = await database_sync_to_async(session_verdict)(key, user_pk, self.session_perm)
                if code is not None:
                    await self.close(code=code)
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # a check that cannot run ends the socket: fail closed
            log.warning("session re-check failed; closing the socket", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=CLOSE_SIGNED_OUT)

    async def session_end(self, message) -> None:
        await self.close(code=CLOSE_SIGNED_OUT)

    async def unbind_session(self) -> None:
        watch, self._session_watch = self._session_watch, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch
        group, self._session_group = self._session_group, None
        if group:
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(group, self.channel_name)
