"""Scalers, label sets, reservations and admission records in the admin: view only.

Configuration comes from ``scalers.yaml`` (import / config-reload operation); host access and
capacity change through approved operations (``kici_site.readonly_admin``).
"""

from django.contrib import admin

from kici_site.readonly_admin import ReadOnlyAdmin, ReadOnlyInline

from .models import (
    ConfigState,
    LabelSet,
    MachinePool,
    MetricCounter,
    RecoveryReport,
    Reservation,
    Scaler,
    ScaleRequest,
    ScalerTeardown,
)


class LabelSetInline(ReadOnlyInline):
    model = LabelSet
    fields = ("index", "normalized", "host_access", "host_access_override", "host_access_override_operation", "retired")


@admin.register(Scaler)
class ScalerAdmin(ReadOnlyAdmin):
    list_display = ("name", "type", "max_agents", "machine_pool", "retiring", "updated_at")
    list_filter = ("type", "retiring")
    search_fields = ("name",)
    inlines = [LabelSetInline]


@admin.register(LabelSet)
class LabelSetAdmin(ReadOnlyAdmin):
    list_display = ("scaler", "index", "normalized", "retired")
    list_filter = ("scaler",)


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ("agent", "scaler", "cpus", "memory_bytes", "owner_instance", "created_at")
    list_filter = ("scaler", "owner_instance")


@admin.register(ScaleRequest)
class ScaleRequestAdmin(ReadOnlyAdmin):
    list_display = ("job_id", "outcome", "cap", "scaler_name", "agent_ref", "attempts", "decided_at")
    list_filter = ("outcome", "cap", "scaler_name")
    search_fields = ("job_id", "run_id", "agent_ref")


@admin.register(RecoveryReport)
class RecoveryReportAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "instance_id",
        "trigger",
        "spawning_agents_rehydrated",
        "spawning_dropped",
        "reservations_rehydrated",
        "reservations_dropped",
        "error",
    )
    list_filter = ("trigger", "instance_id")


for _model in (MachinePool, ConfigState, MetricCounter, ScalerTeardown):
    admin.site.register(_model, ReadOnlyAdmin)
