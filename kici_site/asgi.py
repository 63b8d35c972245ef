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

import asyncio  # noqa: E402
import io  # noqa: E402
from functools import wraps  # noqa: E402
from inspect import iscoroutinefunction  # noqa: E402

from django.conf import settings  # noqa: E402
from django.core import signals  # noqa: E402
from django.core.exceptions import RequestAborted, RequestDataTooBig  # noqa: E402
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix  # noqa: E402
from django.core.handlers.base import BaseHandler  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseBase  # noqa: E402
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix, set_urlconf  # noqa: E402
from django.utils.log import log_response  # noqa: E402

from kici_site.listeners import read_body  # noqa: E402
from lib.errors import API_PREFIX  # noqa: E402
from scalers.api import agent_detail, agent_detail_answer  # noqa: E402


def _without_running_loop(call, *args, **kwargs):
    """``call(*args, **kwargs)`` on the event loop's thread with the running loop set aside, as in
    a synchronous worker: Django's ORM (which refuses to run where an event loop is running) and
    ``async_to_sync`` (which would otherwise refuse to nest in a running loop) see none. Returns
    what ``call`` returns; while it runs, this process serves nothing else."""
    loop = asyncio.get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        return call(*args, **kwargs)
    finally:
        asyncio.events._set_running_loop(loop)


class _RequestProcessed(Exception):
    """Raised in :meth:`ApiHandler.handle`'s task group once the answer is sent: it ends the watch
    for the client's disconnect. One class for every request: a class made per request costs each
    its creation and leaves a reference cycle for the collector."""


class _ResolvedOnce:
    """A handler that resolves a request's path once: :func:`django_http` resolved it already to
    choose the handler (:meth:`SyncApiHandler.route`) and hands the match over."""

    def resolve_request(self, request):
        """The match the request was given, else Django's resolution (404 when none)."""
        return request.resolver_match or super().resolve_request(request)  # type: ignore[misc]


class ApiHandler(_ResolvedOnce, ASGIHandler):
    """The API's asynchronous views (``/scale``, the KiCI scale-up and scale-down): Django's ASGI
    handler over ``settings.KICI_API_MIDDLEWARE``, with the request signals, an error's log line and
    the response's close run on the loop's thread instead of a thread hop each; the view runs on
    the loop beside a watch for the client's disconnect (docs/serving.md, "The machine-facing
    API"). The middleware list is swapped in for the one call that builds the chain."""

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

    async def __call__(self, scope, receive, send, match: ResolverMatch | None = None):
        await self.handle(scope, receive, send, match)

    async def handle(self, scope, receive, send, match: ResolverMatch | None = None):
        """Django's ``ASGIHandler.handle`` with the synchronous parts on the loop's thread.
        ``match``: the path's resolver match when known, so the path is resolved once."""
        body = await read_body(receive)
        if body is None:
            return
        set_script_prefix(get_script_prefix(scope))
        _without_running_loop(signals.request_started.send, sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, io.BytesIO(body))
        if request is None:
            assert error_response is not None, "Django answers a request it could not make"
            await self.send_response(error_response, send)
            _without_running_loop(error_response.close)
            return
        request.resolver_match = match
        response = None
        try:
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self.listen_for_disconnect(receive))
                    response = await self.run_get_response(request)
                    await self.send_response(response, send)
                    raise _RequestProcessed
            except* (_RequestProcessed, RequestAborted):
                pass
        except BaseExceptionGroup as exception_group:
            if len(exception_group.exceptions) == 1:
                raise exception_group.exceptions[0] from None
            raise
        if response is None:
            _without_running_loop(signals.request_finished.send, sender=self.__class__)
        else:
            _without_running_loop(response.close)  # request_finished: connections given back

    async def get_response_async(self, request):
        """Django's, with an error answer's log line written here rather than from a thread."""
        set_urlconf(settings.ROOT_URLCONF)
        response = await self._middleware_chain(request)  # type: ignore[attr-defined]
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response

    async def send_response(self, response, send):
        """Django's, with ``Content-Length`` on an answer that is not streamed: without it the
        server sends the answer chunked (HTTP/1.1) or closes the connection after it (HTTP/1.0)."""
        if not response.streaming and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        await super().send_response(response, send)

    def load_middleware(self, is_async=False):
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.KICI_API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full


class SyncApiHandler(_ResolvedOnce, BaseHandler):
    """The API's synchronous views (every ``/api/`` view but ``/scale``), served as a WSGI worker
    serves them: the body is read on the event loop, then the whole request (signals, middleware,
    view, close) runs as one call on the loop's thread with the loop set aside. While a view runs
    this process serves nothing else; the other processes on the address do (docs/serving.md,
    "The machine-facing API")."""

    def __init__(self):
        super().__init__()
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.KICI_API_MIDDLEWARE
        try:
            self.load_middleware(is_async=False)
        finally:
            settings.MIDDLEWARE = full

    @staticmethod
    def route(scope) -> tuple[bool, ResolverMatch | None]:
        """Whether this handler serves ``scope`` (an ``/api/`` path whose view is synchronous, or
        that no view matches: its 404 is this handler's), and the path's resolver match if any."""
        if not scope["path"].startswith(API_PREFIX):
            return False, None
        try:
            match = get_resolver().resolve(scope["path"])
        except Resolver404:
            return True, None
        return not iscoroutinefunction(match.func), match

    async def __call__(self, scope, receive, send, match: ResolverMatch | None = None):
        body = await read_body(receive)
        if body is None:
            return
        status, headers, content = _without_running_loop(self.respond, scope, body, match)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def respond(
        self, scope, body: bytes, match: ResolverMatch | None = None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The whole of one request: (status, headers, body) of its answer. ``match``: the path's
        resolver match when known (:meth:`route`), so the path is resolved once. A plain GET of an
        agent is answered without Django's handler when it can be (``agent_detail_answer``)."""
        if match is not None and match.func is agent_detail:
            answer = agent_detail_answer(scope, **match.kwargs)
            if answer is not None:
                return answer
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        response: HttpResponseBase
        try:
            request = ASGIRequest(scope, io.BytesIO(body))
        except UnicodeDecodeError:
            response = HttpResponseBadRequest()
        except RequestDataTooBig:
            response = HttpResponse("413 Payload too large", status=413)
        else:
            request.resolver_match = match
            response = self.get_response(request)
        try:
            content = b"".join(response) if response.streaming else response.content  # type: ignore[attr-defined]
            headers = [(header.encode("ascii"), value.encode("latin1")) for header, value in response.items()]
            headers += [
                (b"Set-Cookie", cookie.output(header="").encode("ascii").strip())
                for cookie in response.cookies.values()
            ]
            if not response.has_header("Content-Length"):
                # Without it the server sends the answer chunked (HTTP/1.1) or closes the
                # connection after it (HTTP/1.0).
                headers.append((b"Content-Length", str(len(content)).encode("ascii")))
            return response.status_code, headers, content
        finally:
            response.close()  # request_finished: the connection goes back to the pool


api_asgi_app = ApiHandler()
sync_api_app = SyncApiHandler()


async def django_http(scope, receive, send):
    """The API's synchronous views to :data:`sync_api_app`, its asynchronous ones (``/scale``) to
    :data:`api_asgi_app`, each with the path's match, everything else to the full Django
    application."""
    served, match = SyncApiHandler.route(scope)
    if served:
        return await sync_api_app(scope, receive, send, match)
    if match is not None:
        return await api_asgi_app(scope, receive, send, match)
    return await django_asgi_app(scope, receive, send)


# Import consumers only after Django is set up.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from kici_site.heartbeat_path import HeartbeatPath  # noqa: E402
from kici_site.listeners import API, GATEWAY, ListenerGuard, OperatorOriginValidator  # noqa: E402
from live.routing import websocket_urlpatterns  # noqa: E402

application = ListenerGuard(
    ProtocolTypeRouter(
        {
            "http": django_http,
            "websocket": OperatorOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)

# The agents' gateway processes (kici_site.gateway): the agent API alone, HTTP alone; a heartbeat
# that succeeds is written in a batch and answered ahead of Django (kici_site.heartbeat_path).
gateway_application = ListenerGuard(HeartbeatPath(django_http), listener=GATEWAY)

# The orchestrator's API processes (kici_site.gateway --api): the API but the agent routes, and
# /healthz; HTTP alone.
api_application = ListenerGuard(django_http, listener=API)

# Everything loaded so far lives as long as the process: move it out of the collector's reach, so
# a full collection walks only what requests made, not the framework's heap (a full collection
# over it stalls every request in flight, admission's decider among them).
gc.freeze()
