"""All WebSocket routes, gathered from the apps that define them."""

from importlib import import_module

websocket_urlpatterns = []
for _module in ("agents.routing", "operations.routing", "scalers.routing"):
    try:
        websocket_urlpatterns += import_module(_module).websocket_urlpatterns
    except ModuleNotFoundError as exc:
        if exc.name != _module:
            raise
