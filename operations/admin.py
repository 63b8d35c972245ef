"""Operations, their audit trail and sweep state in the admin: view only.

Operations move only through the services (plan / approve / reject / run); see
``lib.readonly_admin``.
"""

from django.contrib import admin

from lib.readonly_admin import ReadOnlyAdmin, ReadOnlyInline

from .models import AuditEntry, Operation, SweepState


class AuditEntryInline(ReadOnlyInline):
    model = AuditEntry
    fields = ("at", "username", "action", "from_status", "to_status", "detail")


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "kind",
        "status",
        "scaler_name",
        "requested_by",
        "approved_by",
        "rejected_by",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "kind", "requested_via", "auto_approved")
    search_fields = ("scaler_name", "agent_ids", "rq_job_id")
    inlines = [AuditEntryInline]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "operation", "username", "action", "from_status", "to_status", "detail")
    list_filter = ("action", "to_status")
    search_fields = ("username", "detail")
    date_hierarchy = "at"


@admin.register(SweepState)
class SweepStateAdmin(ReadOnlyAdmin):
    list_display = ("sweep_key", "last_run_at", "last_result")
