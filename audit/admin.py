"""Audit records in the admin: view only, like every project model."""

from django.contrib import admin

from lib.readonly_admin import ReadOnlyAdmin

from .models import AuditRecord


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "operation_kind", "scaler_name", "operation_id", "agent_ref")
    list_filter = ("action", "actor_kind")
    search_fields = ("actor", "agent_ref", "detail", "scaler_name")
    date_hierarchy = "at"
