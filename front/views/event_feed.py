"""``/events/``: the global event feed, newest first, live."""

from __future__ import annotations

from django.db.models import Q
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.choices import EventType
from agents.models import ScalerEvent
from kici_site.errors import error_page
from lib.htmx import wants_partial
from lib.query import check_parameters, choice
from scalers.models import Scaler

from .common import css_attr_selector, viewer_required

EVENTS_PAGE_SIZE = 200


@require_GET
@viewer_required
def event_list(request):
    """``/events/``: the global event feed, newest first, live; filters ``type``, ``scaler``, ``q``.
    400 naming the value for an unknown type, an unknown parameter (there is no ``page``: the feed
    is the newest :data:`EVENTS_PAGE_SIZE`), or one given twice (never a silently dropped filter)."""
    try:
        check_parameters(request.GET, single=("type", "scaler", "q"))
        etype = choice("type", request.GET.get("type"), EventType.values)
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    qs = ScalerEvent.objects.all()
    if etype:
        qs = qs.filter(type=etype)
    scaler = (request.GET.get("scaler") or "").strip()
    if scaler:
        qs = qs.filter(scaler_name=scaler)
    q = (request.GET.get("q") or "").strip()[:200]
    if q:
        qs = qs.filter(Q(agent_ref__icontains=q) | Q(detail__icontains=q))
    filtered = bool(etype or scaler or q)
    events = qs[:EVENTS_PAGE_SIZE]
    accept = "".join(
        css_attr_selector(attr, value) for attr, value in (("data-type", etype), ("data-scaler", scaler)) if value
    )
    ctx = {
        "accept": accept,
        "nav": "events",
        "events": events,
        "max_rows": EVENTS_PAGE_SIZE,
        "filters": {"type": etype, "scaler": scaler, "q": q},
        "filtered": filtered,
        "event_types": EventType.choices,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
    }
    if wants_partial(request):
        return render(request, "agents/events.html#results", ctx)
    return render(request, "agents/events.html", ctx)
