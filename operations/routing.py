"""WebSocket route of an operation's live progress."""

from django.urls import path

from .consumers import OperationConsumer

websocket_urlpatterns = [
    path("ws/operations/<int:operation_id>/", OperationConsumer.as_asgi()),
]
