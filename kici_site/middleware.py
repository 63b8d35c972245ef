"""Request guards and error bodies shared by every page and API (see ``lib.errors``).

* :class:`NulByteMiddleware`: a NUL byte (``\\x00``) can never be stored in PostgreSQL text, so a
  request carrying one in its path, a query parameter, a form field or (on ``/api/``) a JSON
  string is answered 400 naming the field, before any view runs or any query is made.
* :class:`ErrorBodyMiddleware`: error responses without a useful body get one: ``/api/`` errors
  that are not JSON (Django's 404 page, the empty 405 of ``require_POST``, a 500 page) become the
  JSON error shape; an empty page error (405) becomes the styled page.

* :class:`NoStoreMiddleware`: ``Cache-Control: no-store`` on every response to a browser with a
  session.

All work in sync and async stacks (the scale API is an async view).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from inspect import iscoroutinefunction

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.utils.cache import add_never_cache_headers
from whitenoise.middleware import WhiteNoiseMiddleware

from lib.errors import api_error, error_page, is_api_request
from lib.json_input import parse_json
from lib.wording import key_path

NUL = "\x00"
#: A NUL in a JSON body: the escape that writes it (a raw NUL byte is not valid JSON).
JSON_NUL = b"\\u0000"
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _json_nul_field(value, path: str = "") -> str | None:
    """The JSON path (``labels[2]``, ``resources.memory``) of the first string or key holding NUL."""
    if isinstance(value, str):
        return (path or "body") if NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = key_path(path, str(key))
            if NUL in str(key):
                return here.replace(NUL, "\\u0000")
            found = _json_nul_field(item, here)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _json_nul_field(item, f"{path}[{index}]" if path else f"[{index}]")
            if found:
                return found
    return None


#: Characters of a refused query or form value the page message quotes.
SHOWN_VALUE_CHARS = 64


def _query_dict_field(data, where: str) -> tuple[str, str | None] | None:
    """``(field, value)`` of the first parameter holding NUL (value None when the name holds it)."""
    for key, values in data.lists():
        if NUL in key:
            return f"{where} parameter name {key.replace(NUL, '\\x00')!r}", None
        for value in values:
            if isinstance(value, str) and NUL in value:
                return key, value
    return None


def nul_field(request) -> tuple[str, str | None] | None:
    """Where a request carries a NUL byte, as ``(field, value)``: ``"path"``, a query or form field
    name with its value, a JSON path (``/api/`` bodies; value None), or None. Pure (no database);
    reads the body only when it holds one."""
    if NUL in request.path_info or NUL in request.path:
        return "path", None
    found = _query_dict_field(request.GET, "query")
    if found:
        return found
    if request.method in ("POST", "PUT", "PATCH", "DELETE"):
        content_type = request.content_type or ""
        try:
            if content_type in _FORM_TYPES:
                return _query_dict_field(request.POST, "form")
            if is_api_request(request):
                body = request.body
                if JSON_NUL in body:
                    try:
                        field = _json_nul_field(parse_json(body))
                    except (ValueError, UnicodeDecodeError):
                        return None  # malformed JSON: the view says so
                    return (field, None) if field else None
        except RequestDataTooBig:
            return None  # the view answers 413
    return None


def _shown(value: str) -> str:
    """``value`` as a Python literal (NUL as ``\\x00``): whole up to :data:`SHOWN_VALUE_CHARS`
    characters, else that many from a little before its first NUL, marked with "…"."""
    if len(value) <= SHOWN_VALUE_CHARS:
        return repr(value)
    start = max(0, value.index(NUL) - SHOWN_VALUE_CHARS // 2)
    piece = value[start : start + SHOWN_VALUE_CHARS]
    return ("…" if start else "") + repr(piece) + ("…" if start + SHOWN_VALUE_CHARS < len(value) else "")


def nul_refusal(request, field: str, value: str | None = None):
    """The 400 answer for a NUL byte in ``field`` (JSON on ``/api/``, else the styled page, or the
    htmx error fragment); a page's message quotes the refused ``value``."""
    message = f"{field} contains a NUL byte (\\x00), which is never valid here; nothing was done"
    if is_api_request(request):
        return api_error(400, "invalid-request", message, field=field)
    if value is not None:
        message = f"{field} contains a NUL byte (\\x00), which is never valid here: {_shown(value)}; nothing was done"
    return error_page(request, 400, message, title="Bad request")


class _DualMiddleware(ABC):
    """Middleware usable in sync and async stacks; subclasses define ``handle`` / ``ahandle``."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self.ahandle(request)
        return self.handle(request)

    @abstractmethod
    def handle(self, request):
        """The response to ``request`` in a sync stack."""

    @abstractmethod
    async def ahandle(self, request):
        """The response to ``request`` in an async stack."""


class NulByteMiddleware(_DualMiddleware):
    """400 naming the field for a NUL byte anywhere a view would read it (module doc)."""

    def handle(self, request):
        found = nul_field(request)
        if found:
            return nul_refusal(request, *found)
        return self.get_response(request)

    async def ahandle(self, request):
        found = nul_field(request)
        if found:
            # The page frame reads the session user: database access, so off the event loop.
            return await sync_to_async(nul_refusal)(request, *found)
        return await self.get_response(request)


_PAGE_MESSAGES = {
    405: "This address does not accept a {method} request. Use the buttons and forms of the console pages.",
}


def _needs_api_body(request, response) -> bool:
    return (
        response.status_code >= 400
        and is_api_request(request)
        and not response.get("Content-Type", "").startswith("application/json")
        and not getattr(response, "streaming", False)
    )


def _needs_page_body(request, response) -> bool:
    return (
        response.status_code in _PAGE_MESSAGES
        and not is_api_request(request)
        and not getattr(response, "streaming", False)
        and not response.content
    )


def _api_body(request, response):
    status = response.status_code
    message = ""
    if status == 405:
        allowed = response.get("Allow", "")
        message = f"{request.method} is not allowed here; allowed: {allowed or 'none'}"
    elif status == 404:
        message = f"no API endpoint at {request.path}"
    fixed = api_error(status, None, message)
    for header in ("Allow", "WWW-Authenticate", "Retry-After"):
        if response.has_header(header):
            fixed[header] = response[header]
    return fixed


def _page_body(request, response):
    fixed = error_page(
        request, response.status_code, _PAGE_MESSAGES[response.status_code].format(method=request.method)
    )
    if response.has_header("Allow"):
        fixed["Allow"] = response["Allow"]
    return fixed


class ErrorBodyMiddleware(_DualMiddleware):
    """JSON bodies for ``/api/`` errors, styled pages for empty page errors (module doc)."""

    def handle(self, request):
        response = self.get_response(request)
        if _needs_api_body(request, response):
            return _api_body(request, response)
        if _needs_page_body(request, response):
            return _page_body(request, response)
        return response

    async def ahandle(self, request):
        response = await self.get_response(request)
        if _needs_api_body(request, response):
            return _api_body(request, response)
        if _needs_page_body(request, response):
            return await sync_to_async(_page_body)(request, response)
        return response


def _signed_in_browser(request, response) -> bool:
    """A request carrying the session cookie, or a response setting it (a sign-in)."""
    name = settings.SESSION_COOKIE_NAME
    return name in request.COOKIES or name in response.cookies


class NoStoreMiddleware(_DualMiddleware):
    """``Cache-Control: no-store`` (with Django's other never-cache headers) on every response to
    a browser with a session: its pages show agents, rules and operations that neither the
    browser's cache nor a proxy may keep after sign-out. Cookie-less requests (the agent API,
    ``/api/v1/scale``) are left as they are."""

    def handle(self, request):
        response = self.get_response(request)
        if _signed_in_browser(request, response):
            add_never_cache_headers(response)
        return response

    async def ahandle(self, request):
        response = await self.get_response(request)
        if _signed_in_browser(request, response):
            add_never_cache_headers(response)
        return response


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise's static files in a sync or async stack. WhiteNoise's own middleware is sync
    only, so under ASGI every request, not only a static file's, crossed to a thread and back
    around it (two thread hops per API call). Here a request for anything else passes straight
    on, and a static file is served from a worker thread."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request):
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
