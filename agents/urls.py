"""Agent API routes, mounted at ``/api/v1/agents/`` by ``kici_site.urls``."""

from django.urls import path

from . import api

app_name = "agents_api"

urlpatterns = [
    path("register", api.register, name="register"),
    path("claim", api.claim, name="claim"),
    path("<str:agent_id>/heartbeat", api.heartbeat, name="heartbeat"),
]
