"""Routes of the admission side, mounted at the site root: the orchestrator's API (scale, follow
and end agents) and ``/metrics``. The agent's own routes are in ``agents.urls``."""

from django.urls import path

from . import api, metrics

urlpatterns = [
    path("api/v1/scale", api.scale, name="api_scale"),
    path("api/v1/agents", api.agent_list, name="api_agent_list"),
    path("api/v1/agents/<str:agent_id>", api.agent_detail, name="api_agent_detail"),
    path("api/v1/agents/<str:agent_id>/job-complete", api.job_complete, name="api_job_complete"),
    path("api/v1/agents/<str:agent_id>/release", api.agent_release, name="api_agent_release"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
