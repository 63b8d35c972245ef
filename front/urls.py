"""Page routes of the operator console (the JSON APIs are in ``agents.urls`` and ``scalers.urls``):
mounted at ``/``."""

from django.urls import path

from .views import agent_list, agent_page, console, dashboard, event_feed, isolation

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("agents/", agent_list.agent_list, name="agent_list"),
    path("agents/<str:agent_id>/", agent_page.agent_detail, name="agent_detail"),
    path("agents/<str:agent_id>/isolation/", isolation.agent_isolation, name="agent_isolation"),
    path("agents/<str:agent_id>/isolation/selftest", isolation.agent_selftest, name="agent_selftest"),
    path("agents/<str:agent_id>/console/", console.agent_console, name="agent_console"),
    path("agents/<str:agent_id>/console/<str:stream>/", console.agent_console, name="agent_console_stream"),
    path(
        "agents/<str:agent_id>/console/<str:stream>/download",
        console.agent_console_download,
        name="agent_console_download",
    ),
    path("events/", event_feed.event_list, name="event_list"),
]
