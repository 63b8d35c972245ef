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


def delete_in_batches(queryset: models.QuerySet, *, key: str = "pk", after=None) -> int:
    """Delete ``queryset`` by primary key, :data:`BATCH` rows a statement, at most
    :data:`BATCHES_PER_CALL` statements; returns the rows of its model deleted (the rest waits for
    the next call). ``after(keys)``: called with each deleted batch's ``key`` values."""
    model = queryset.model
    deleted = 0
    for _ in range(BATCHES_PER_CALL):
        rows = list(queryset.values_list("pk", key)[:BATCH])
        if not rows:
            break
        _, per_model = model.objects.filter(pk__in=[pk for pk, _ in rows]).delete()
        deleted += per_model.get(model._meta.label, 0)
        if after is not None:
            after([value for _, value in rows])
        if len(rows) < BATCH:
            break
    return deleted


def prune_old_records(now: datetime | None = None) -> dict[str, int]:
    """Delete what retention has passed (module doc); returns ``{"agents", "events", "tokens"}``
    counts (events and tokens of pruned agents go with them and are not counted again)."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.KICI_RETENTION_DAYS)
    agents = Agent.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=cutoff, reservation__isnull=True).order_by(
        "pk"
    )
    return {
        # An agent's events and tokens cascade; its kept output goes after it.
        "agents": delete_in_batches(agents, key="agent_id", after=delete_archives),
        "events": delete_in_batches(ScalerEvent.objects.filter(created_at__lt=cutoff).order_by("pk")),
        "tokens": delete_in_batches(AgentToken.objects.filter(expires_at__lt=cutoff).order_by("pk")),
    }
