"""Which jobs wait.

A job waits when its latest decision (``ScaleRequest``) left it queued (``WAITING_OUTCOMES``)
within ``WAITING_WINDOW`` and no agent serves it: an orchestrator that asks twice for one job
gets the second ask refused while the first one's agent holds the slot, so a record can say
``at-capacity`` for a job that runs. The "Why waiting" page and "Needs attention" both read
:func:`waiting_requests`.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from agents.choices import ACTIVE_STATES
from agents.models import Agent

from .models import WAITING_OUTCOMES, WAITING_WINDOW, ScaleRequest


def waiting_requests(now: datetime) -> QuerySet[ScaleRequest]:
    """The records of the jobs waiting at ``now`` (module docstring), unordered.

    A job is served, so not waiting, while an active agent is bound to it, or once an agent
    completed it (looked for among the agents active or created within ``WAITING_WINDOW``, which
    bounds the look-up; it misses only a job that ran longer than the window). Each look-up is one
    hashed sub-select, whatever the number of records."""
    bound = Agent.objects.filter(state__in=ACTIVE_STATES).exclude(bound_job_id="").values("bound_job_id")
    completed = (
        Agent.objects.filter(Q(state__in=ACTIVE_STATES) | Q(created_at__gte=now - WAITING_WINDOW))
        .exclude(completed_job_id="")
        .values("completed_job_id")
    )
    return (
        ScaleRequest.objects.filter(outcome__in=WAITING_OUTCOMES, decided_at__gte=now - WAITING_WINDOW)
        .exclude(job_id__in=bound)
        .exclude(job_id__in=completed)
        .order_by()
    )
