from django.contrib import admin

from .models import AuditEntry, Operation, SweepState


class AuditEntryInline(admin.TabularInline):
    model = AuditEntry
    extra = 0
    can_delete = False
    fields = ("at", "username", "action", "from_status", "to_status", "detail")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Every field shown read-only; nothing is added or changed from the admin."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    """Read-only: operations move only through the services (approve / reject / run)."""

    list_display = ("id", "kind", "status", "scaler_name", "requested_by", "approved_by", "rejected_by", "created_at", "finished_at")
    list_filter = ("status", "kind", "requested_via", "auto_approved")
    search_fields = ("scaler_name", "agent_ids", "rq_job_id")
    inlines = [AuditEntryInline]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "operation", "username", "action", "from_status", "to_status", "detail")
    list_filter = ("action", "to_status")
    search_fields = ("username", "detail")
    date_hierarchy = "at"

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(SweepState)
class SweepStateAdmin(admin.ModelAdmin):
    list_display = ("sweep_key", "last_run_at", "last_result")
