"""How long a signed-in session lives: ``KICI_SESSION_IDLE_SECONDS`` after its last request and
``KICI_SESSION_MAX_SECONDS`` after its sign-in; :class:`SessionLifetimeMiddleware` renews the
expiry at most once per :func:`renew_every` seconds instead of a write per request
(docs/browser-security.md). Requests without a session cookie pass with no database access.
"""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import SESSION_KEY

from .middleware import _DualMiddleware

#: Session keys: when the user signed in, when the expiry was last renewed (Unix seconds).
SIGNED_IN_AT = "kici_signed_in_at"
RENEWED_AT = "kici_renewed_at"


def renew_every() -> int:
    """Seconds between two renewals of a busy session's expiry: a tenth of the idle time, at most 60."""
    return min(60, settings.KICI_SESSION_IDLE_SECONDS // 10)


def renew(session, now: float | None = None) -> None:
    """Slide the expiry of a signed-in ``session`` (a ``SessionBase``) when due: to ``now`` plus
    the idle time, capped at its sign-in plus the absolute maximum; past that it is flushed."""
    if SESSION_KEY not in session:
        return
    now = int(time.time() if now is None else now)
    signed_in = session.get(SIGNED_IN_AT)
    if signed_in is None:
        session[SIGNED_IN_AT] = signed_in = now
    left = signed_in + settings.KICI_SESSION_MAX_SECONDS - now
    if left <= 0:
        session.flush()
        return
    if session.modified or now - session.get(RENEWED_AT, 0) >= renew_every():
        session[RENEWED_AT] = now
        session.set_expiry(min(settings.KICI_SESSION_IDLE_SECONDS, left))


def _has_session(request) -> bool:
    session = getattr(request, "session", None)
    return session is not None and (settings.SESSION_COOKIE_NAME in request.COOKIES or session.modified)


class SessionLifetimeMiddleware(_DualMiddleware):
    """Renews the expiry of a signed-in session after its response (:func:`renew`); between
    ``SessionMiddleware`` (which then saves it) and the views."""

    def handle(self, request):
        response = self.get_response(request)
        if _has_session(request):
            renew(request.session)
        return response

    async def ahandle(self, request):
        response = await self.get_response(request)
        if _has_session(request):
            await sync_to_async(renew)(request.session)
        return response
