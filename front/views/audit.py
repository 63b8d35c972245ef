"""``/audit/``: the console-wide audit trail (``audit.models.AuditRecord``), newest first, a page at a
time, filtered by who, what, when, scaler, agent and operation; ``?format=csv`` and ``?format=json``
export what the filters select, streamed and bounded.

Who may read it: the ``audit.view_auditrecord`` permission, which ``operations.roles`` grants to
operators and approvers (it names people, tokens and sign-in addresses); viewers get 403."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents.listing import MAX_PAGE, page_number
from audit.choices import AuditAction
from audit.listing import AUDIT_PARAMETERS, EXPORT_FIELDS, AuditFilters, export_row, parse_filters
from audit.models import AuditRecord
from lib.errors import error_page
from lib.htmx import wants_partial
from lib.query import check_parameters, choice
from operations.choices import OperationKind
from scalers.models import Scaler

from .common import query_string

AUDIT_PERM = "audit.view_auditrecord"

#: Rows per page of ``/audit/``.
AUDIT_PAGE_SIZE = 100
#: Most rows one export holds; a larger selection is cut there and says so (``X-Audit-Truncated``,
#: and ``truncated`` in the JSON): narrow the time range to export the rest.
EXPORT_MAX = 100_000
#: Rows read from the database per round trip of an export.
EXPORT_CHUNK = 2000

#: The "last …" links above the filters: label and how far back ``since`` goes (the other filters kept).
QUICK_RANGES = (("last hour", timedelta(hours=1)), ("last 24 h", timedelta(days=1)), ("last 7 days", timedelta(days=7)))

#: Accepted ``what`` values: every audit action, then every operation kind.
WHAT_CHOICES = (*AuditAction.values, *OperationKind.values)


def audit_required(view):
    """Signed in, with ``audit.view_auditrecord`` (403 for a signed-in user without it)."""
    return login_required(permission_required(AUDIT_PERM, raise_exception=True)(view))


@require_GET
@audit_required
def audit_list(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """``/audit/``: a page of audit records (:data:`AUDIT_PAGE_SIZE`), or the export named by
    ``format``. 400 naming the parameter for an unknown or repeated parameter, an unknown ``what``,
    a time that does not parse, ``until`` not after ``since``, or a bad page or format."""
    try:
        check_parameters(request.GET, single=AUDIT_PARAMETERS)
        filters = parse_filters(request.GET, WHAT_CHOICES)
        fmt = choice("format", request.GET.get("format"), ("csv", "json"))
        number = page_number(request.GET.get("page"))
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    qs = filters.apply(AuditRecord.objects.all())
    if fmt:
        return _export(qs, fmt)
    paginator = Paginator(qs, AUDIT_PAGE_SIZE)
    page = paginator.get_page(number)
    last_page = min(paginator.num_pages, MAX_PAGE)
    query = query_string(**_query_values(filters))
    now = timezone.now()
    quick = [
        (label, query_string(**(_query_values(filters) | {"since": _form_time(now - span), "until": ""})))
        for label, span in QUICK_RANGES
    ]
    ctx = {
        "nav": "audit",
        "entries": page.object_list,
        "filters": filters,
        "form": _query_values(filters),
        "page": page,
        "count": paginator.count,
        "last_page": last_page,
        "capped": paginator.num_pages > MAX_PAGE,
        "has_next": page.number < last_page,
        "query": query,
        "actions": AuditAction.choices,
        "operation_kinds": OperationKind.choices,
        "scaler_names": list(Scaler.objects.order_by("name").values_list("name", flat=True)),
        "export_max": EXPORT_MAX,
        "quick_ranges": quick,
    }
    if wants_partial(request):
        return render(request, "audit/list.html#results", ctx)
    return render(request, "audit/list.html", ctx)


def _form_time(value: datetime | None) -> str:
    """A filter time as a ``datetime-local`` input shows it (UTC, to the minute or second)."""
    if value is None:
        return ""
    local = timezone.localtime(value)
    return local.strftime("%Y-%m-%dT%H:%M:%S" if local.second else "%Y-%m-%dT%H:%M")


def _query_values(filters: AuditFilters) -> dict[str, str]:
    return {
        "who": filters.who,
        "what": filters.what,
        "scaler": filters.scaler,
        "agent": filters.agent,
        "operation": str(filters.operation) if filters.operation is not None else "",
        "since": _form_time(filters.since),
        "until": _form_time(filters.until),
    }


def _export(qs: QuerySet[AuditRecord], fmt: str) -> StreamingHttpResponse:
    """The records of ``qs``, newest first, at most :data:`EXPORT_MAX`, as a streamed CSV or JSON
    attachment; ``X-Audit-Rows`` says how many it holds, ``X-Audit-Truncated`` whether it was cut."""
    total = qs.count()
    rows = min(total, EXPORT_MAX)
    truncated = total > EXPORT_MAX
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    if fmt == "csv":
        body, content_type = _csv_chunks(qs, rows), "text/csv; charset=utf-8"
    else:
        body, content_type = _json_chunks(qs, rows, total, truncated), "application/json"
    response = StreamingHttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="kici-audit-{stamp}.{fmt}"'
    response["X-Audit-Rows"] = str(rows)
    response["X-Audit-Truncated"] = "true" if truncated else "false"
    return response


def _chunk(qs: QuerySet[AuditRecord], after: tuple[datetime, int] | None, size: int) -> list[dict]:
    """The next ``size`` records of ``qs`` (newest first) after key ``after`` (``(at, id)``)."""
    if after is not None:
        qs = qs.filter(Q(at__lt=after[0]) | Q(at=after[0], id__lt=after[1]))
    return [export_row(e) | {"_key": (e.at, e.pk)} for e in qs.order_by("-at", "-id")[:size]]


async def _records(qs: QuerySet[AuditRecord], limit: int) -> AsyncIterator[dict]:
    """At most ``limit`` export rows, read :data:`EXPORT_CHUNK` at a time by key (``at``, ``id``), so an
    export holds one chunk in memory and no database cursor between reads."""
    after: tuple[datetime, int] | None = None
    left = limit
    while left > 0:
        chunk = await sync_to_async(_chunk)(qs, after, min(EXPORT_CHUNK, left))
        if not chunk:
            return
        for row in chunk:
            after = row.pop("_key")
            yield row
        left -= len(chunk)


async def _csv_chunks(qs: QuerySet[AuditRecord], limit: int) -> AsyncIterator[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=EXPORT_FIELDS)
    writer.writeheader()
    n = 0
    async for row in _records(qs, limit):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
        n += 1
        if n % 500 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


async def _json_chunks(qs: QuerySet[AuditRecord], limit: int, total: int, truncated: bool) -> AsyncIterator[str]:
    yield '{"entries": ['
    n = 0
    async for row in _records(qs, limit):
        yield ("" if not n else ",\n") + json.dumps(row)
        n += 1
    yield f'], "count": {n}, "total": {total}, "truncated": {json.dumps(truncated)}}}\n'
