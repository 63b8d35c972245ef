"""WebSocket routes of the agents app (gathered by ``kici_site.routing``); see ``agents.consumers``."""

from django.urls import path

from .consumers import ConsoleConsumer, EventsConsumer

websocket_urlpatterns = [
    path("ws/agents/<str:agent_id>/console/<str:stream>/", ConsoleConsumer.as_asgi()),
    path("ws/agents/<str:agent_id>/events/", EventsConsumer.as_asgi()),
    path("ws/events/", EventsConsumer.as_asgi()),
]
