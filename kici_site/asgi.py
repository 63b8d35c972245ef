"""ASGI entry point: HTTP through Django, WebSockets through Channels, both behind the listener
guard (what each listener serves, body size); WebSockets only from the console's own pages
(``kici_site.listeners.OperatorOriginValidator``: scheme, host and port of the ``Origin``).

The machine-facing API (``/api/``) goes through its own Django handler with the short middleware
list ``KICI_API_MIDDLEWARE`` (:class:`ApiHandler`), the pages through the full one."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")
django_asgi_app = get_asgi_application()

from functools import wraps  # noqa: E402
from inspect import iscoroutinefunction  # noqa: E402

from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.db import close_old_connections  # noqa: E402

from lib.errors import API_PREFIX  # noqa: E402


class ApiHandler(ASGIHandler):
    """Django's ASGI handler over ``settings.KICI_API_MIDDLEWARE`` instead of ``MIDDLEWARE``.
    Django reads the list from settings when it builds the chain, once, when the handler is made
    (at import, before any request): the list is swapped in for that call alone.

    A synchronous view gives its database connection back (to the process's pool) in the thread
    and call that used it, as it returns: left to the end of the request, the pooled connections
    of concurrent requests were lost under load and the pool ran dry."""

    def make_view_atomic(self, view):
        view = super().make_view_atomic(view)
        if iscoroutinefunction(view):
            return view

        @wraps(view)
        def returning_its_connection(*args, **kwargs):
            try:
                return view(*args, **kwargs)
            finally:
                close_old_connections()

        return returning_its_connection

    def load_middleware(self, is_async=False):
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.KICI_API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full


api_asgi_app = ApiHandler()


async def django_http(scope, receive, send):
    """``/api/`` to :data:`api_asgi_app`, everything else to the full Django application."""
    app = api_asgi_app if scope["path"].startswith(API_PREFIX) else django_asgi_app
    return await app(scope, receive, send)


# Import consumers only after Django is set up.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from kici_site.listeners import ListenerGuard, OperatorOriginValidator  # noqa: E402
from live.routing import websocket_urlpatterns  # noqa: E402

application = ListenerGuard(
    ProtocolTypeRouter(
        {
            "http": django_http,
            "websocket": OperatorOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)

# The agents' gateway processes (kici_site.gateway): the agent API alone, HTTP alone.
gateway_application = ListenerGuard(django_http, gateway=True)

# Everything loaded so far lives as long as the process: move it out of the collector's reach, so
# a full collection walks only what requests made, not the framework's heap (a full collection
# over it stalls every request in flight, admission's decider among them).
gc.freeze()
