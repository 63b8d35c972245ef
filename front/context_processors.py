"""Template context every page shares: ``attention``, what needs a person (the nav badge)."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.utils.functional import SimpleLazyObject

from operations.attention import Attention, needs_attention

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
