"""The audit record: one row per audited change, written where the change happens, in its
transaction (``audit.records.record``), so a change and its record commit or roll back together.

Rows name what they refer to by value (``scaler_name``, ``operation_id``, ``agent_ref``), not by
foreign key: the record outlives the scaler, operation or agent it names, and this app sits below
every app that writes to it.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .choices import ACTION_BADGES, ActorKind, AuditAction


class AuditRecord(models.Model):
    """Who (``actor``: a user name, an API token's name or ``system``) did what (``action``, and for
    operations their ``operation_kind``), when (``at``), to which scaler, operation or agent, with a
    one-line ``detail``; ``remote_addr`` for sign-ins."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=40, choices=AuditAction.choices)
    actor = models.CharField(max_length=200, blank=True)
    actor_kind = models.CharField(max_length=10, choices=ActorKind.choices, default=ActorKind.SYSTEM)
    scaler_name = models.CharField(max_length=200, blank=True)
    operation_id = models.BigIntegerField(null=True, blank=True)
    operation_kind = models.CharField(max_length=40, blank=True)
    agent_ref = models.CharField(max_length=100, blank=True)
    detail = models.TextField(blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["action", "at"]),
            models.Index(fields=["actor", "at"]),
            models.Index(fields=["scaler_name", "at"]),
            models.Index(fields=["operation_kind", "at"]),
            models.Index(fields=["operation_id"]),
            models.Index(fields=["agent_ref"]),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor or 'system'} {self.action}"

    @property
    def badge(self) -> str:
        return ACTION_BADGES.get(self.action, "b-blue")  # type: ignore[call-overload]
