"""``/agents/``: every agent, filtered by state, scaler and a search term."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.listing import LIST_PAGE_SIZE, STATE_FILTERS, filter_agents
from lib.htmx import wants_partial
from scalers.models import Scaler

from .common import viewer_required


@require_GET
@viewer_required
def agent_list(request):
    """``/agents/``: every agent with filters; htmx requests get only the table."""
    qs, cleaned = filter_agents(request.GET)
    page = Paginator(qs, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    rows_query = QueryDict(mutable=True)
    rows_query.update({**cleaned, "page": page.number})
    ctx = {
        "nav": "agents",
        "page": page,
        "agents": page.object_list,
        "agent_limit": LIST_PAGE_SIZE,
        "filters": cleaned,
        "state_filters": STATE_FILTERS,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
        "query": query.urlencode(),
        "rows_query": rows_query.urlencode(),
        "empty_text": "No agent matches these filters.",
    }
    if wants_partial(request):
        return render(request, "agents/list.html#results", ctx)
    return render(request, "agents/list.html", ctx)
