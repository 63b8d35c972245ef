"""Pruning old records so the tables stop growing: finished agents (with their events and tokens),
old events, expired tokens. Run by the leading sweeper, in batches so one round stays short.

Retention: ``KICI_RETENTION_DAYS`` (default 14). An agent is pruned that many days after it
finished (``destroyed`` or ``failed``) and only once it holds no reservation, with its kept output
(``agents.archive``); an event that many days after it was recorded; a token that many days after
it expired.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from .archive import delete_archives
from .choices import TERMINAL_STATES
from .models import Agent, AgentToken, ScalerEvent

#: Rows deleted per statement, and statements per table per call.
BATCH = 1000
BATCHES_PER_CALL = 10


def _delete_in_batches(queryset: models.QuerySet) -> int:
    """Delete ``queryset`` by primary key, :data:`BATCH` rows a statement, at most
    :data:`BATCHES_PER_CALL` statements; returns the rows deleted (the rest waits for the next call)."""
    deleted = 0
    for _ in range(BATCHES_PER_CALL):
        pks = list(queryset.values_list("pk", flat=True)[:BATCH])
        if not pks:
            break
        deleted += queryset.model.objects.filter(pk__in=pks).delete()[0]
        if len(pks) < BATCH:
            break
    return deleted


def prune_old_records(now: datetime | None = None) -> dict[str, int]:
    """Delete what retention has passed (module doc); returns ``{"agents", "events", "tokens"}``
    counts (events and tokens of pruned agents go with them and are not counted again)."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.KICI_RETENTION_DAYS)
    agents = Agent.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=cutoff, reservation__isnull=True).order_by(
        "pk"
    )
    pruned_agents = 0
    for _ in range(BATCHES_PER_CALL):
        pks = list(agents.values_list("pk", flat=True)[:BATCH])
        if not pks:
            break
        agent_ids = list(Agent.objects.filter(pk__in=pks).values_list("agent_id", flat=True))
        _, per_model = Agent.objects.filter(pk__in=pks).delete()  # its events and tokens cascade
        delete_archives(agent_ids)
        pruned_agents += per_model.get(Agent._meta.label, 0)
        if len(pks) < BATCH:
            break
    return {
        "agents": pruned_agents,
        "events": _delete_in_batches(ScalerEvent.objects.filter(created_at__lt=cutoff).order_by("pk")),
        "tokens": _delete_in_batches(AgentToken.objects.filter(expires_at__lt=cutoff).order_by("pk")),
    }
