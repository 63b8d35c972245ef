"""Agents, tokens and events in the admin: view only (``lib.readonly_admin``)."""

from django.contrib import admin

from lib.readonly_admin import ReadOnlyAdmin

from .models import Agent, AgentToken, ScalerEvent


@admin.register(Agent)
class AgentAdmin(ReadOnlyAdmin):
    list_display = ("agent_id", "scaler", "state", "ip", "warm", "bound_job_id", "created_at", "last_heartbeat")
    list_filter = ("state", "scaler", "warm")
    search_fields = ("agent_id", "managed_id", "bound_job_id")


@admin.register(AgentToken)
class AgentTokenAdmin(ReadOnlyAdmin):
    list_display = ("agent", "prefix", "created_at", "expires_at", "used_at")
    exclude = ("token_hash",)

    def get_readonly_fields(self, request, obj=None):
        return [name for name in super().get_readonly_fields(request, obj) if name != "token_hash"]


@admin.register(ScalerEvent)
class ScalerEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "type", "agent_ref", "scaler_name", "detail")
    list_filter = ("type",)
    search_fields = ("agent_ref", "detail")
