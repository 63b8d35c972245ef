"""``/agents/<agent_id>/shell/``: an approver's terminal in a running or held container agent
(the socket and the bridge: ``live.consumers.ShellConsumer``, ``live.shell``), and the download
of the agent's shell transcripts."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.archive import shell_transcript_path
from live.shell import SHELL_PERM, may_open_shells, shell_refusal

from .common import agent_or_404, viewer_required


def _require_approver(user) -> None:
    if not may_open_shells(user):
        raise PermissionDenied(f"a shell is for approvers: you lack the permission {SHELL_PERM}")


@require_GET
@viewer_required
def agent_shell(request, agent_id: str):
    """The terminal page (403 for a user who is not an approver). An agent the shell cannot enter
    (not running or held, not a container agent) gets the page with the reason and no terminal."""
    _require_approver(request.user)
    agent = agent_or_404(agent_id)
    ctx = {
        "nav": "agents",
        "agent": agent,
        "refusal": shell_refusal(request.user, agent),
        "ws_url": f"/ws/agents/{agent.agent_id}/shell/",
        "has_transcript": shell_transcript_path(agent.agent_id).exists(),
        "transcript_url": reverse("agent_shell_transcript", args=[agent.agent_id]),
        "max_seconds": settings.KICI_SHELL_MAX_SECONDS,
        "idle_seconds": settings.KICI_SHELL_IDLE_SECONDS,
    }
    return render(request, "agents/shell.html", ctx)


@require_GET
@viewer_required
def agent_shell_transcript(request, agent_id: str):
    """The agent's shell transcripts as a text attachment, bytes as recorded (approvers; kept after
    the agent is gone, until retention deletes its archive). 404 when no shell was ever opened."""
    _require_approver(request.user)
    agent = agent_or_404(agent_id)
    try:
        fd = os.open(shell_transcript_path(agent.agent_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise Http404(f"no shell was opened into agent {agent.agent_id}") from None
    return FileResponse(
        os.fdopen(fd, "rb"),
        as_attachment=True,
        filename=f"{agent.agent_id}-shell.log",
        content_type="text/plain; charset=utf-8",
    )
