"""Template context every page shares: ``attention``, what needs a person (the nav badge), and
``pauses``, the pauses in force (the banner)."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.utils.functional import SimpleLazyObject

from operations.attention import Attention, needs_attention
from scalers.pauses import current_pauses

from .views.common import VIEW_PERM

log = logging.getLogger(__name__)


def _read(user) -> Attention | None:
    if not user.has_perm(VIEW_PERM):
        return None
    try:
        return needs_attention()
    except DatabaseError:
        # The page itself may still render (an error page does): it goes without the badge.
        log.warning("could not read what needs attention", exc_info=True)
        return None


def attention(request) -> dict:
    """``attention``: ``operations.attention.needs_attention()`` for a signed-in user with
    ``agents.view_agent`` (None without it), read only when a template uses it, so htmx partials
    and JSON answers pay nothing."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"attention": SimpleLazyObject(lambda: _read(user))}


def _pauses(user) -> list[dict]:
    if not user.has_perm(VIEW_PERM):
        return []
    try:
        return current_pauses()
    except DatabaseError:
        log.warning("could not read the pauses", exc_info=True)
        return []


def pauses(request) -> dict:
    """``pauses``: ``scalers.pauses.current_pauses()`` for a signed-in user with
    ``agents.view_agent`` (the banner every page shows: who paused what, and why), read only when a
    template uses it."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"pauses": SimpleLazyObject(lambda: _pauses(user))}
