from django.contrib import admin

from .models import Agent, AgentToken, ScalerEvent


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("agent_id", "scaler", "state", "ip", "warm", "bound_job_id", "created_at", "last_heartbeat")
    list_filter = ("state", "scaler", "warm")
    search_fields = ("agent_id", "managed_id", "bound_job_id")


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ("agent", "prefix", "created_at", "expires_at", "used_at")
    readonly_fields = ("token_hash",)


@admin.register(ScalerEvent)
class ScalerEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "type", "agent_ref", "scaler_name", "detail")
    list_filter = ("type",)
    search_fields = ("agent_ref", "detail")
