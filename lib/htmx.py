"""The htmx partial rule of the pages."""

from __future__ import annotations


def wants_partial(request) -> bool:
    """True for an htmx request that is not a boosted page navigation: the view renders the named
    partial of its template instead of the whole page (``request.htmx`` comes from django-htmx's
    middleware)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted
