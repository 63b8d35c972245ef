"""``/events/``: the global event feed, newest first, a page at a time; the first page is live."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import Q
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.choices import EventType
from agents.listing import MAX_PAGE, page_number
from agents.models import ScalerEvent
from lib.errors import error_page
from lib.htmx import wants_partial
from lib.query import check_parameters, choice
from scalers.models import Scaler

from .common import css_attr_selector, query_string, viewer_required

#: Rows per page of ``/events/`` (and the rows the live first page keeps).
EVENTS_PAGE_SIZE = 200

#: Parameters of ``/events/``, each taken once.
EVENT_PARAMETERS = ("type", "scaler", "q", "page")


@require_GET
@viewer_required
def event_list(request):
    """``/events/``: a page of the global event feed, newest first (:data:`EVENTS_PAGE_SIZE` a page,
    ``page`` up to ``agents.listing.MAX_PAGE``, as on ``/agents/``); filters ``type``, ``scaler``,
    ``q``, kept by the pager. Live on the first page only: new events go on top, so an older page
    would take rows that are not its own. 400 naming the value for an unknown type, a page that is
    not a number in range, an unknown parameter, or one given twice (never a silently dropped
    filter)."""
    try:
        check_parameters(request.GET, single=EVENT_PARAMETERS)
        etype = choice("type", request.GET.get("type"), EventType.values)
        number = page_number(request.GET.get("page"))
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
    paginator = Paginator(qs, EVENTS_PAGE_SIZE)
    page = paginator.get_page(number)
    last_page = min(paginator.num_pages, MAX_PAGE)
    accept = "".join(
        css_attr_selector(attr, value) for attr, value in (("data-type", etype), ("data-scaler", scaler)) if value
    )
    scaler_names = list(Scaler.objects.values_list("name", flat=True))
    ctx = {
        "accept": accept,
        "nav": "events",
        "events": page.object_list,
        "max_rows": EVENTS_PAGE_SIZE,
        "filters": {"type": etype, "scaler": scaler, "q": q},
        "filtered": filtered,
        "page": page,
        "count": paginator.count,
        "last_page": last_page,
        "capped": paginator.num_pages > MAX_PAGE,
        "has_next": page.number < last_page,
        "live": not q and page.number == 1,
        "query": query_string(type=etype, scaler=scaler, q=q),
        "event_types": EventType.choices,
        "scaler_names": scaler_names,
        "unknown_scaler": bool(scaler) and scaler not in scaler_names,
    }
    if wants_partial(request):
        return render(request, "agents/events.html#results", ctx)
    return render(request, "agents/events.html", ctx)
