"""Which jobs wait, and whether the cap that refused one still holds it: :func:`waiting_requests`
(read by the "Why waiting" page and "Needs attention") and :class:`CapsNow`, which decides a
recorded ``at-capacity`` request again with admission's own cap check. When a job counts as
waiting, and for how long: docs/attention.md ("What counts").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Q, QuerySet

from agents.choices import ACTIVE_STATES
from agents.models import Agent

from .admission import ledger
from .admission.caps import Usage, first_refusing_cap
from .admission.matching import ScalerInfo, World
from .models import WAITING_OUTCOMES, WAITING_WINDOW, ScaleOutcome, ScaleRequest

#: Outcomes the orchestrator is told to ask again after (a 409 or 503 with ``Retry-After``).
RETRIED_OUTCOMES = (ScaleOutcome.AT_CAPACITY, ScaleOutcome.SKIPPED)
#: The shortest retry window, whatever ``KICI_SCALE_RETRY_AFTER_SECONDS`` says.
MIN_RETRY_WINDOW = timedelta(seconds=60)


def retry_window() -> timedelta:
    """How long a job told to ask again still counts as waiting without asking: three of its
    ``Retry-After`` intervals (``KICI_SCALE_RETRY_AFTER_SECONDS``), at least a minute."""
    return max(MIN_RETRY_WINDOW, timedelta(seconds=3 * settings.KICI_SCALE_RETRY_AFTER_SECONDS))


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
    asking = Q(outcome__in=RETRIED_OUTCOMES, decided_at__gte=now - retry_window())
    permanent = [o for o in WAITING_OUTCOMES if o not in RETRIED_OUTCOMES]
    refused = Q(outcome__in=permanent, decided_at__gte=now - WAITING_WINDOW)
    return (
        ScaleRequest.objects.filter(asking | refused).exclude(job_id__in=bound).exclude(job_id__in=completed).order_by()
    )


class CapsNow:
    """The caps and the usage as they stand (read without the admission lock: a view, not a
    decision), to decide a refused request again."""

    def __init__(self, world: World, usage: Usage):
        self.world = world
        self.usage = usage
        self._by_name: dict[str, ScalerInfo] = {s.name: s for s in world.scalers.values()}

    @classmethod
    def read(cls) -> CapsNow:
        """Two queries (the config row, the usage snapshot), and the config rows when they changed
        since the last read of any caller (the shared ``WORLD_CACHE``). Raises database errors."""
        with connection.cursor() as cur:
            world, usage = ledger.load_snapshot(cur, ledger.read_config(cur))
        return cls(world, usage)

    def refusing_cap(self, scaler_name: str, cpus: float, memory_bytes: int, recorded_cap: str) -> str | None:
        """The cap that would refuse a request of ``cpus`` cores and ``memory_bytes`` on scaler
        ``scaler_name`` now, or None when none would (it would be admitted if asked).

        ``recorded_cap`` is returned as it stands when the request cannot be decided again: its
        scaler is gone or retiring (a new ask is routed anew, maybe elsewhere)."""
        info = self._by_name.get(scaler_name)
        if info is None or info.retiring:
            return recorded_cap
        pool = self.world.pools.get(info.caps.machine_pool_id) if info.caps.machine_pool_id else None
        cap = first_refusing_cap(self.usage, self.world.glob, info.caps, pool, cpus, memory_bytes)
        return str(cap) if cap is not None else None
