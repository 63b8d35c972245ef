"""Every WebSocket route of the console; served by ``kici_site/asgi.py``. Consumers: :mod:`live.consumers`."""

from django.urls import path

from .consumers import (
    AttentionConsumer,
    ConsoleConsumer,
    EventsConsumer,
    OperationConsumer,
    RowsConsumer,
    ShellConsumer,
)

websocket_urlpatterns = [
    path("ws/agents/<str:agent_id>/console/<str:stream>/", ConsoleConsumer.as_asgi()),
    path("ws/agents/<str:agent_id>/events/", EventsConsumer.as_asgi()),
    path("ws/agents/<str:agent_id>/shell/", ShellConsumer.as_asgi()),
    path("ws/events/", EventsConsumer.as_asgi()),
    path("ws/operations/<int:operation_id>/", OperationConsumer.as_asgi()),
    path("ws/rows/<str:view>/", RowsConsumer.as_asgi()),
    path("ws/attention/", AttentionConsumer.as_asgi()),
]
