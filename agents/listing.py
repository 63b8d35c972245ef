"""Which agents a list shows: the filters of ``/agents/``, shared by the page and its live rows."""

from __future__ import annotations

import ipaddress

from django.db.models import Q

from .choices import ACTIVE_STATES, AgentState
from .models import Agent

#: Rows per page of ``/agents/``.
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
