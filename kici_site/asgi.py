"""ASGI entry point: HTTP through Django, WebSockets through Channels, both behind the listener
guard (what each listener serves, body size); WebSockets only from the console's own pages
(``kici_site.listeners.OperatorOriginValidator``: scheme, host and port of the ``Origin``)."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")
django_asgi_app = get_asgi_application()

# Import consumers only after Django is set up.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from kici_site.listeners import ListenerGuard, OperatorOriginValidator  # noqa: E402
from live.routing import websocket_urlpatterns  # noqa: E402

application = ListenerGuard(
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": OperatorOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)

# Everything loaded so far lives as long as the process: move it out of the collector's reach, so
# a full collection walks only what requests made, not the framework's heap (a full collection
# over it stalls every request in flight, admission's decider among them).
gc.freeze()
