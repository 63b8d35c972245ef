"""``/agents/<agent_id>/``: one agent's state, labels, host access and timeline."""

from __future__ import annotations

from django.db.models import Q
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.archive import shell_transcript_path
from agents.models import ScalerEvent
from lib.errors import error_page
from lib.query import check_parameters, choice
from live.rows import agent_page_version, host_access_view
from scalers.holds import MAX_REASON as MAX_HOLD_REASON
from scalers.selftest import can_run_selftest

from .common import agent_or_404, viewer_required
from .console import console_streams


@require_GET
@viewer_required
def agent_detail(request, agent_id: str):
    """``/agents/<agent_id>/``: state, labels, timestamps, host access, rules in force, timeline;
    ``?part=events`` only the timeline's rows. 400 naming any other parameter or part."""
    agent = agent_or_404(agent_id)
    try:
        check_parameters(request.GET, single=("part",))
        part = choice("part", request.GET.get("part"), ("events",))
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    events = ScalerEvent.objects.filter(Q(agent=agent) | Q(agent_ref=agent.agent_id)).order_by("-created_at", "-id")[
        :500
    ]
    if part == "events":
        return render(
            request,
            "dashboard/index.html#event_tbody",
            {"events": events, "max_rows": 500, "resync_url": request.get_full_path()},
        )
    ctx = {
        "nav": "agents",
        "agent": agent,
        "agents": [agent],
        "events": events,
        "max_rows": 500,
        "host_access": host_access_view(agent),
        "can_selftest": can_run_selftest(request.user),
        "max_hold_reason": MAX_HOLD_REASON,
        "streams": console_streams(agent),
        "shell_transcripts": shell_transcript_path(agent.agent_id).exists(),
        "page_version": agent_page_version(agent),
        "event_resync_url": f"{reverse('agent_detail', args=[agent.agent_id])}?part=events",
    }
    return render(request, "agents/detail.html", ctx)
