from django.contrib import admin

from .models import ConfigState, LabelSet, MachinePool, Reservation, Scaler


class LabelSetInline(admin.TabularInline):
    model = LabelSet
    extra = 0
    fields = ("index", "normalized", "host_access", "retired")
    readonly_fields = ("index", "normalized")


@admin.register(Scaler)
class ScalerAdmin(admin.ModelAdmin):
    list_display = ("name", "type", "max_agents", "machine_pool", "retiring", "updated_at")
    list_filter = ("type", "retiring")
    search_fields = ("name",)
    inlines = [LabelSetInline]


@admin.register(LabelSet)
class LabelSetAdmin(admin.ModelAdmin):
    list_display = ("scaler", "index", "normalized", "retired")
    list_filter = ("scaler",)


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ("agent", "scaler", "cpus", "memory_bytes", "owner_instance", "created_at")
    list_filter = ("scaler", "owner_instance")


admin.site.register(MachinePool)
admin.site.register(ConfigState)


# --- Admission records (helper "adm") ---------------------------------------------------------
from .models import MetricCounter, RecoveryReport, ScalerTeardown, ScaleRequest  # noqa: E402


@admin.register(ScaleRequest)
class ScaleRequestAdmin(admin.ModelAdmin):
    list_display = ("job_id", "outcome", "cap", "scaler_name", "agent_ref", "attempts", "decided_at")
    list_filter = ("outcome", "cap", "scaler_name")
    search_fields = ("job_id", "run_id", "agent_ref")


@admin.register(RecoveryReport)
class RecoveryReportAdmin(admin.ModelAdmin):
    list_display = ("created_at", "instance_id", "trigger", "spawning_agents_rehydrated", "spawning_dropped",
                    "reservations_rehydrated", "reservations_dropped", "error")
    list_filter = ("trigger", "instance_id")


admin.site.register(MetricCounter)
admin.site.register(ScalerTeardown)
