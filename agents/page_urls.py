"""Page routes of the operator console (the JSON API is in ``agents.api``): mounted at ``/``."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("agents/", views.agent_list, name="agent_list"),
    path("agents/<str:agent_id>/", views.agent_detail, name="agent_detail"),
    path("agents/<str:agent_id>/isolation/", views.agent_isolation, name="agent_isolation"),
    path("agents/<str:agent_id>/isolation/selftest", views.agent_selftest, name="agent_selftest"),
    path("agents/<str:agent_id>/console/", views.agent_console, name="agent_console"),
    path("agents/<str:agent_id>/console/<str:stream>/", views.agent_console, name="agent_console_stream"),
    path(
        "agents/<str:agent_id>/console/<str:stream>/download",
        views.agent_console_download,
        name="agent_console_download",
    ),
    path("events/", views.event_list, name="event_list"),
]
