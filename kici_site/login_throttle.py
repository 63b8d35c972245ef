"""The user name django-axes counts failed logins under (``AXES_USERNAME_CALLABLE``)."""

from __future__ import annotations

from django.conf import settings

#: Characters of a user name axes stores (its attempt and lockout tables' ``username`` column).
STORED_USERNAME_CHARS = 255


def throttled_username(request, credentials: dict | None = None) -> str | None:
    """The posted (or given) user name, cut to what axes stores: a longer one, which no account
    can have, must be counted and answered like any failure, not fail the sign-in page with a
    database error."""
    field = getattr(settings, "AXES_USERNAME_FORM_FIELD", "username")  # set by axes.conf at import
    source = credentials if credentials else getattr(request, "data", request.POST)
    username = source.get(field)
    return username[:STORED_USERNAME_CHARS] if isinstance(username, str) else username
