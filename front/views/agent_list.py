"""``/agents/``: every agent, filtered by state, scaler and a search term."""

from __future__ import annotations

import ipaddress

from django.core.paginator import Paginator
from django.db.models import Q
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.choices import ACTIVE_STATES, AgentState
from agents.models import Agent
from lib.htmx import wants_partial
from scalers.models import Scaler

from .common import viewer_required

LIST_PAGE_SIZE = 100


STATE_FILTERS = [("active", "active"), ("all", "all states"), *[(s.value, s.value) for s in AgentState]]


def filter_agents(params) -> tuple:
    """Apply the list filters ``state`` (a state, ``active`` or ``all``; default active), ``scaler``
    (name) and ``q`` (substring of agent id, managed id, address, bound job, or a label) to agents.

    Returns ``(queryset, cleaned)`` with ``cleaned`` the values actually applied (unknown ones dropped).
    """
    qs = Agent.objects.select_related("scaler")
    state = params.get("state") or "active"
    if state == "active":
        qs = qs.filter(state__in=ACTIVE_STATES)
    elif state in AgentState.values:
        qs = qs.filter(state=state)
    else:
        state = "all"
    scaler = (params.get("scaler") or "").strip()
    if scaler:
        qs = qs.filter(scaler__name=scaler)
    q = (params.get("q") or "").strip()[:200]
    if q:
        cond = (
            Q(agent_id__icontains=q)
            | Q(managed_id__icontains=q)
            | Q(bound_job_id__icontains=q)
            | Q(labels__contains=[q])
        )
        try:
            cond |= Q(ip=str(ipaddress.ip_address(q)))
        except ValueError:
            pass
        qs = qs.filter(cond)
    return qs, {"state": state, "scaler": scaler, "q": q}


@require_GET
@viewer_required
def agent_list(request):
    """``/agents/``: every agent with filters; htmx requests get only the table."""
    qs, cleaned = filter_agents(request.GET)
    page = Paginator(qs, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    ctx = {
        "nav": "agents",
        "page": page,
        "agents": page.object_list,
        "filters": cleaned,
        "state_filters": STATE_FILTERS,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
        "query": query.urlencode(),
        "empty_text": "No agent matches these filters.",
    }
    if wants_partial(request):
        return render(request, "agents/list.html#results", ctx)
    return render(request, "agents/list.html", ctx)
