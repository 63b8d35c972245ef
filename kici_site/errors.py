"""One shape for every error the console answers: JSON for ``/api/v1/*``, a styled page elsewhere.

JSON (every ``/api/v1`` endpoint)::

    {"error": {"code": "invalid-request", "message": "labels[0]: must be a string, got 5",
               "field": "labels[0]"},          # "field" only when one field is at fault
     "reason": "invalid-request",              # the same code, kept at the top level
     ...}                                      # endpoint extras, e.g. /scale's 409 "cap"

``reason`` stays at the top level because the scale API's callers read it there
(409 ``{reason: "at-capacity", cap}``, 422 ``{reason: "no-matching-label-set"}``).

Pages: ``templates/400.html`` / ``403.html`` / ``404.html`` / ``405.html`` extend the page frame
(navigation, styling); ``templates/500.html`` is static (no database, no request context).
"""

from __future__ import annotations

from http import HTTPStatus

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import TemplateDoesNotExist
from django.template.loader import render_to_string

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


def error_page(request: HttpRequest, status: int, message: str = "", *, title: str = "") -> HttpResponse:
    """A styled error page (``templates/<status>.html``, else ``templates/error.html``) with the
    page frame's navigation. ``message`` says what went wrong in the operator's words."""
    context = {
        "status": status,
        "title": title or HTTPStatus(status).phrase,
        "message": message,
        "request_path": request.path,
    }
    try:
        html = render_to_string(f"{status}.html", context, request=request)
    except TemplateDoesNotExist:
        html = render_to_string("error.html", context, request=request)
    return HttpResponse(html, status=status)


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
