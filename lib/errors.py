"""One shape for every error the console answers: JSON for ``/api/v1/*`` (``{"error": {"code",
"message", "field"?}, "reason": code, ...}``: docs/api-contract.md), a styled page elsewhere
(``templates/<status>.html``; ``500.html`` is static, no database or request context). htmx
requests (``lib.htmx.wants_partial``) get the error fragment, and the pages swap every 4xx into
the request's target (``responseHandling`` in ``templates/base.html``), so an operator always sees
why a request was refused and a stale "ok" preview never stays on the page.
"""

from __future__ import annotations

from http import HTTPStatus

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import TemplateDoesNotExist
from django.template.loader import render_to_string
from django.utils.http import parse_header_parameters

from lib.htmx import wants_partial

#: Paths answered with JSON errors instead of pages.
API_PREFIX = "/api/"

#: ``error.code`` of a JSON error whose view did not choose one, by HTTP status.
STATUS_CODES = {
    400: "invalid-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    410: "gone",
    413: "invalid-request",
    415: "unsupported-media-type",
    422: "unprocessable",
    429: "too-many-requests",
    500: "internal-error",
    502: "bad-gateway",
    503: "unavailable",
}


def is_api_request(request: HttpRequest) -> bool:
    """True for ``/api/…`` paths (JSON errors); pages get HTML."""
    return request.path_info.startswith(API_PREFIX)


def api_error(
    status: int, code: str | None = None, message: str = "", *, field: str | None = None, **extra
) -> JsonResponse:
    """The JSON error response of every ``/api/v1`` endpoint (shape in the module doc).

    ``code`` defaults to :data:`STATUS_CODES` for ``status``; ``message`` to the status phrase.
    ``extra`` keys go to the top level next to ``error`` and ``reason`` (e.g. ``cap``).
    401 answers carry ``WWW-Authenticate: Bearer``; 503 answers ``Retry-After: 5``.
    """
    code = code or STATUS_CODES.get(status, "error")
    error = {"code": code, "message": message or HTTPStatus(status).phrase}
    if field is not None:
        error["field"] = field
    response = JsonResponse({"error": error, "reason": code, **extra}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="kici"'
    if status == 503:
        response["Retry-After"] = "5"
    return response


#: The one media type a JSON body of ``/api/v1`` is accepted as (parameters such as ``charset`` aside).
JSON_CONTENT_TYPE = "application/json"


def json_content_type_accepted(sent: str, content_length: str) -> bool:
    """Whether a POST to a JSON endpoint with the ``Content-Type`` ``sent`` and the
    ``Content-Length`` ``content_length`` (each ``""`` when absent) may be read as JSON (the rule
    of :func:`json_content_type_refusal`). Raises ValueError for a ``Content-Type`` too long to
    parse."""
    return parse_header_parameters(sent)[0] == JSON_CONTENT_TYPE or (not sent and content_length in ("", "0"))


def json_content_type_refusal(request: HttpRequest) -> JsonResponse | None:
    """None when a POST to a JSON endpoint may be read as JSON: its ``Content-Type`` is
    ``application/json`` (any parameters, e.g. ``; charset=utf-8``), or it has neither a body nor a
    ``Content-Type``. Otherwise the 415 ``unsupported-media-type`` answer naming the content type
    sent, so a client posting ``text/plain`` or a form learns at once instead of by a guess."""
    sent = request.META.get("CONTENT_TYPE", "")
    if json_content_type_accepted(sent, request.headers.get("Content-Length", "")):
        return None
    shown = repr(sent[:100]) if sent else "none"
    response = api_error(
        415,
        "unsupported-media-type",
        f"Content-Type {shown} is not accepted: send the body as {JSON_CONTENT_TYPE}",
        field="Content-Type",
    )
    response["Accept-Post"] = JSON_CONTENT_TYPE
    return response


def error_page(request: HttpRequest, status: int, message: str = "", *, title: str = "") -> HttpResponse:
    """A styled error page (``templates/<status>.html``, else ``templates/error.html``) with the
    page frame's navigation. ``message`` says what went wrong in the operator's words.

    For an htmx request: ``templates/htmx_error.html``, an alert that replaces the request's
    target (``HX-Reswap: outerHTML``) and keeps the target's id (``HX-Target``), so the element's
    next request (the input corrected) finds its target again and swaps the real answer back.
    """
    context = {
        "status": status,
        "title": title or HTTPStatus(status).phrase,
        "message": message,
        "request_path": request.path,
    }
    if wants_partial(request):
        context["target"] = request.headers.get("HX-Target", "")
        response = HttpResponse(render_to_string("htmx_error.html", context, request=request), status=status)
        response["HX-Reswap"] = "outerHTML"
        return response
    try:
        html = render_to_string(f"{status}.html", context, request=request)
    except TemplateDoesNotExist:
        html = render_to_string("error.html", context, request=request)
    return HttpResponse(html, status=status)


def _exception_message(exception) -> str:
    """The message an ``Http404`` / ``PermissionDenied`` / ``BadRequest`` was raised with, if a string."""
    args = getattr(exception, "args", ())
    return args[0] if args and isinstance(args[0], str) else ""


def bad_request(request: HttpRequest, exception) -> HttpResponse:
    """``handler400``: Django's 400 (e.g. ``SuspiciousOperation``) through :func:`error_page`."""
    return error_page(request, 400, _exception_message(exception))


def permission_denied(request: HttpRequest, exception) -> HttpResponse:
    """``handler403``: ``PermissionDenied`` through :func:`error_page` (its message, if any)."""
    return error_page(request, 403, _exception_message(exception), title="Not allowed")


def page_not_found(request: HttpRequest, exception) -> HttpResponse:
    """``handler404``: ``Http404`` through :func:`error_page` (its message, if any)."""
    return error_page(request, 404, _exception_message(exception))


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: the styled 403 page instead of Django's bare one."""
    if is_api_request(request):
        return api_error(403, "csrf-failed", f"CSRF verification failed: {reason}")
    return error_page(
        request,
        403,
        f"The form could not be accepted ({reason}). Reload the page and try again; nothing was changed.",
        title="Form expired or not accepted",
    )
