"""The machine-facing routes, mounted at the site root: what an agent calls (register, claim, its
heartbeat), the orchestrator's API (scale, follow and end agents), the OpenAPI document of both,
and ``/metrics``."""

from django.urls import path

from . import agent_api, api, openapi, scrape

urlpatterns = [
    path("api/v1/agents/register", agent_api.register, name="agent_register"),
    path("api/v1/agents/claim", agent_api.claim, name="agent_claim"),
    path("api/v1/agents/<str:agent_id>/heartbeat", agent_api.heartbeat, name="agent_heartbeat"),
    path("api/v1/openapi.json", openapi.openapi_json, name="api_openapi"),
    path("api/v1/scale", api.scale, name="api_scale"),
    path("api/v1/scale/kici-event/scale-up", api.kici_scale_up, name="api_kici_scale_up"),
    path("api/v1/scale/kici-event/scale-down", api.kici_scale_down, name="api_kici_scale_down"),
    path("api/v1/agents", api.agent_list, name="api_agent_list"),
    path("api/v1/agents/<str:agent_id>", api.agent_detail, name="api_agent_detail"),
    path("api/v1/agents/<str:agent_id>/job-complete", api.job_complete, name="api_job_complete"),
    path("api/v1/agents/<str:agent_id>/release", api.agent_release, name="api_agent_release"),
    path("metrics", scrape.metrics_view, name="metrics"),
]
