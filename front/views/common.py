"""What every operator page shares: the access rule and small template helpers.

Every page needs a signed-in user with ``agents.view_agent`` (anonymous users are sent to the login
page, signed-in users without the permission get 403). htmx requests (not boosted) get the named
partial of the same template instead of the whole page (``lib.htmx.wants_partial``), so a table
re-fetch and the first render share their markup.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required, permission_required
from django.http import QueryDict
from django.shortcuts import get_object_or_404

from agents.models import Agent

VIEW_PERM = "agents.view_agent"


def viewer_required(view):
    """``login_required`` + ``agents.view_agent`` (403 for a signed-in user without it)."""
    return login_required(permission_required(VIEW_PERM, raise_exception=True)(wraps(view)(view)))


def css_attr_selector(attr: str, value: str) -> str:
    """``[attr="value"]`` with ``value`` escaped as a CSS string (for ``data-accept`` filters)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'[{attr}="{escaped}"]'


def query_string(**values) -> str:
    """The query string of a list's URL: ``values`` url-encoded, empty and None ones left out (a
    link carries only the filters in force)."""
    query = QueryDict(mutable=True)
    query.update({k: v for k, v in values.items() if v not in ("", None)})
    return query.urlencode()


def agent_or_404(agent_id: str) -> Agent:
    """The agent with ``agent_id`` (its scaler and label set loaded), or ``Http404``."""
    return get_object_or_404(Agent.objects.select_related("scaler", "label_set"), agent_id=agent_id)
