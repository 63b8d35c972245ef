"""The htmx partial rule of the pages."""

from __future__ import annotations


def wants_partial(request) -> bool:
    """True for an htmx request that is not a boosted page navigation: the view renders the named
    partial of its template instead of the whole page, and an error answer is the error fragment
    (``lib.errors.error_page``). Read from the ``HX-Request`` / ``HX-Boosted`` headers, as
    django-htmx does, so that it also holds in middleware that runs before django-htmx's."""
    headers = request.headers
    return headers.get("HX-Request") == "true" and headers.get("HX-Boosted") != "true"
