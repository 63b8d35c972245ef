"""Scalers, label sets, caps and the reservation ledger.

The reservation rows ARE the admitted set: every count cap is derived from them, never from a
counter kept beside them (seed manager.d.ts, ``reservedCountForScaler``).
"""

from __future__ import annotations

from django.db import models

from .choices import ScalerType


class ConfigState(models.Model):
    """The global part of the imported ``scalers.yaml`` (a singleton row, pk=1).

    Admission locks this row to serialise the decision across every console process that
    shares the database (see ``scalers.admission``).
    """

    global_max_agents = models.PositiveIntegerField(default=50)
    global_max_cpu = models.FloatField(null=True, blank=True)
    global_max_memory_bytes = models.BigIntegerField(null=True, blank=True)
    defaults = models.JSONField(default=dict, blank=True, help_text="defaults.resources as in scalers.yaml")
    firecracker = models.JSONField(default=dict, blank=True, help_text="the top-level firecracker network block")
    source = models.CharField(max_length=500, blank=True)
    imported_at = models.DateTimeField(null=True, blank=True)
    raw = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "config state"

    def __str__(self):
        return f"config from {self.source or '(none)'}"

    @classmethod
    def load(cls) -> "ConfigState":
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj


class MachinePool(models.Model):
    """A resource cap shared by several scalers on one machine (SPEC c.4; replaces the file ledger)."""

    name = models.CharField(max_length=200, unique=True)
    max_cpu = models.FloatField(null=True, blank=True)
    max_memory_bytes = models.BigIntegerField(null=True, blank=True)

    def __str__(self):
        return self.name


class Scaler(models.Model):
    """One ``scalers[]`` entry. Removed entries are kept, marked retiring (SPEC c.8)."""

    name = models.CharField(max_length=200, unique=True)
    type = models.CharField(max_length=20, choices=ScalerType.choices)
    max_agents = models.PositiveIntegerField()
    max_concurrent_spawns = models.PositiveIntegerField(default=8)
    max_cpu = models.FloatField(null=True, blank=True, help_text="resourceCap.maxCpu")
    max_memory_bytes = models.BigIntegerField(null=True, blank=True, help_text="resourceCap.maxMemory in bytes")
    machine_pool = models.ForeignKey(MachinePool, null=True, blank=True, on_delete=models.SET_NULL, related_name="scalers")
    mandatory_labels = models.JSONField(default=list, blank=True)
    roles = models.JSONField(null=True, blank=True, help_text="null = all roles")
    orchestrator_url = models.CharField(max_length=500, blank=True)
    warm_pool_enabled = models.BooleanField(default=False)
    warm_pool_size = models.PositiveIntegerField(default=0)
    warm_pool_idle_timeout_seconds = models.FloatField(default=300)
    config = models.JSONField(default=dict, blank=True, help_text="the whole entry as imported")
    retiring = models.BooleanField(default=False)
    retiring_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class LabelSet(models.Model):
    """One ``labelSets[]`` entry of a scaler, in config order (``index``)."""

    scaler = models.ForeignKey(Scaler, on_delete=models.CASCADE, related_name="label_sets")
    index = models.PositiveIntegerField()
    labels = models.JSONField(help_text="canonical (trimmed, lower-case) declared labels")
    normalized = models.CharField(max_length=1000, help_text="sorted, de-duplicated, comma-joined")
    config = models.JSONField(default=dict, blank=True, help_text="the whole label-set entry as imported")
    host_access = models.JSONField(
        null=True, blank=True, help_text="explicit networkPolicy.hostAccess; null = the default (SPEC g.3)"
    )
    retired = models.BooleanField(default=False)

    class Meta:
        ordering = ["scaler__name", "index"]
        constraints = [models.UniqueConstraint(fields=["scaler", "index"], name="labelset_scaler_index_unique")]

    def __str__(self):
        return f"{self.scaler.name}[{self.index}] {self.normalized}"


class Reservation(models.Model):
    """Capacity held for one agent from admission until release (SPEC c.2, c.3).

    ``cpus`` and ``memory_bytes`` are the resolved *requests*; caps compare their sums.
    """

    scaler = models.ForeignKey(Scaler, on_delete=models.CASCADE, related_name="reservations")
    agent = models.OneToOneField("agents.Agent", on_delete=models.CASCADE, related_name="reservation")
    machine_pool = models.ForeignKey(MachinePool, null=True, blank=True, on_delete=models.SET_NULL)
    cpus = models.FloatField(default=0)
    memory_bytes = models.BigIntegerField(default=0)
    limit_cpus = models.FloatField(default=0)
    limit_memory_bytes = models.BigIntegerField(default=0)
    owner_instance = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner_instance"])]

    def __str__(self):
        return f"reservation {self.agent_id} on {self.scaler_id}"
