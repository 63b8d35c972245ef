"""Operation pages: the list with filters, the operation page, the plan request, approve / reject.

Every POST is CSRF-protected (Django's middleware; htmx sends the token from ``<body hx-headers>``)
and checks its permission first (403 with nothing changed). Refusals the operator can act on
(expired plan, no worker on the queue, nothing to do) come back as a page that says so.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from agents.listing import page_number
from lib.errors import error_page
from lib.htmx import wants_partial
from lib.query import check_parameters, whole_number
from lib.wording import json_text
from operations.choices import OperationKind, OperationStatus, RequestedVia
from operations.kinds.base import PlanRefused, ScopeInvalid
from operations.kinds.catalog import get_kind
from operations.listing import LIST_PARAMETERS, PAGE_SIZE, filter_operations
from operations.models import Operation
from operations.presenters import bulk_rows, detail_context, plan_pages, preview_context
from operations.services import (
    APPROVE_PERM,
    DECISION_NOTE_MAX,
    REQUEST_PERM,
    VIEW_PERM,
    NoteTooLong,
    NothingToDo,
    OperationError,
    approve_operation,
    approve_operations,
    check_bulk_selection,
    preview_operation,
    reject_operation,
    store_plan,
    stored_plan,
)
from scalers.models import Scaler


@require_GET
@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def operation_list(request: HttpRequest) -> HttpResponse:
    """``/operations/?status=&kind=&scaler=&page=``: newest first, 50 a page; 400 naming the value
    for an unknown status or kind, a page that is not a number in range, an unknown parameter, or
    one given twice (each takes one value)."""
    try:
        check_parameters(request.GET, single=LIST_PARAMETERS)
        qs, filters = filter_operations(request.GET)
        number = page_number(request.GET.get("page"))
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    page = Paginator(qs, PAGE_SIZE).get_page(number)
    context = {
        "nav": "operations",
        "page": page,
        "operations": page.object_list,
        "filters": filters,
        "statuses": OperationStatus.choices,
        "kinds": OperationKind.choices,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
    }
    template = "operations/list.html#rows" if wants_partial(request) else "operations/list.html"
    return render(request, template, context)


@require_GET
@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def operation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """``/operations/<pk>/?page=``: the operation, its plan a page at a time (1 to its last page).
    400 naming the value for a page that is not a number in range or any other parameter."""
    operation = get_object_or_404(
        Operation.objects.select_related("scaler", "label_set", "requested_by", "approved_by", "rejected_by"), pk=pk
    )
    try:
        check_parameters(request.GET, single=("page",))
        page = whole_number("page", request.GET.get("page"), 1, plan_pages(operation), default=1)
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    return render(
        request, "operations/detail.html", {"nav": "operations", **detail_context(operation, request.user, page=page)}
    )


def _scope_from_post(request: HttpRequest) -> dict:
    params: dict = {}
    if request.POST.get("host_access_revert"):
        params["revert_to_file"] = True
    elif request.POST.get("host_access_default"):
        params["host_access"] = None
    elif request.POST.get("host_access_set") or "host_access" in request.POST:
        params["host_access"] = [
            line.strip() for value in request.POST.getlist("host_access") for line in value.splitlines() if line.strip()
        ]
    for name in ("host", "reason"):
        if name in request.POST:
            params[name] = request.POST[name]
    if "seconds" in request.POST:  # a hold's duration; a non-number is refused naming it (AgentHold.validate_scope)
        seconds = request.POST["seconds"].strip()
        params["seconds"] = int(seconds) if seconds.isdigit() else seconds
    if "drain" in request.POST:  # a checkbox; anything else is refused naming it (Pause.validate_scope)
        drain = request.POST["drain"]
        params["drain"] = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False}.get(
            drain, drain
        )
    return {
        "scaler": request.POST.get("scaler", "").strip() or None,
        "agent_ids": request.POST.getlist("agent"),
        "label_set": request.POST.get("label_set", "").strip() or None,
        "params": params,
    }


#: The form fields of a plan request that describe it (what "Request approval" posts again).
#: Every field :func:`_scope_from_post` reads: the preview page posts them all back with its
#: "Request approval" (a field left out here would be dropped between the preview and the request).
PLAN_FIELDS = ("kind", "scaler", "agent", "label_set", "host_access", "host_access_set", "host_access_default",
               "host_access_revert", "host", "reason", "drain", "seconds")  # fmt: skip


@require_POST
@login_required
@permission_required(REQUEST_PERM, raise_exception=True)
def operation_plan(request: HttpRequest) -> HttpResponse:
    """Plan an operation from a form (``kind``, ``scaler``, ``agent``, ``label_set``, ``host_access``
    with ``host_access_set``/``_default``/``_revert``, ``host``, ``reason``, ``drain``, ``seconds``).
    Without ``request=1`` a dry run that stores nothing; with it the plan is made again and stored
    (an identical open plan is shown instead), unless it differs from the previewed ``digest``: then
    it is shown as a preview again, so what is approved is what its requester saw. Design:
    docs/operations.md and docs/ARCHITECTURE.md ("How an orphan reap flows").
    """
    kind = request.POST.get("kind", "")
    try:
        operation_kind = get_kind(kind)
    except ValueError as exc:
        return render(
            request, "operations/refused.html", {"title": "Unknown operation", "message": str(exc)}, status=400
        )
    scope = _scope_from_post(request)
    storing = request.POST.get("request") == "1"
    try:
        name, resolved, plan = preview_operation(operation_kind.name, scope, request.user)
        previewed = request.POST.get("digest", "")
        changed = storing and previewed and previewed != stored_plan(name, plan)[1]
        if storing and not changed:
            operation = store_plan(name, resolved, plan, request.user, via=RequestedVia.UI)
    except (ScopeInvalid, PlanRefused) as exc:
        return render(
            request, "operations/refused.html", {"title": "Cannot plan this", "message": str(exc)}, status=400
        )
    except NothingToDo as exc:
        return render(
            request,
            "operations/nothing.html",
            {"nav": "operations", "kind_label": operation_kind.label, "plan": exc.plan, "message": str(exc)},
            status=200,
        )
    except OperationError as exc:
        return render(
            request, "operations/refused.html", {"title": "Cannot plan this", "message": str(exc)}, status=409
        )
    if not storing or changed:
        if changed:  # what is approved is what the requester saw: a changed plan is shown, not stored
            messages.warning(
                request,
                "The plan changed since your preview, so nothing was stored: below is what was found now; "
                "review it and request approval again.",
            )
        fields = [(n, value) for n in PLAN_FIELDS for value in request.POST.getlist(n)]
        context = {"nav": "operations", "fields": fields, **preview_context(name, resolved, plan)}
        return render(request, "operations/preview.html", context)
    if operation.reused:
        messages.info(request, f"An identical plan is already open: operation #{operation.pk}.")
    url = reverse("operations:detail", args=[operation.pk])
    return HttpResponseClientRedirect(url) if wants_partial(request) else redirect(url)


def _require_deciding(user) -> None:
    """PermissionDenied unless ``user`` may see operations and decide them: an approver who cannot
    see an operation's plan and evidence must not approve it."""
    for perm in (VIEW_PERM, APPROVE_PERM):
        if not user.has_perm(perm):
            raise PermissionDenied(f"you lack the permission {perm}")


def _decide(request: HttpRequest, pk: int, verb: str) -> HttpResponse:
    _require_deciding(request.user)
    operation = get_object_or_404(Operation, pk=pk)
    context = {
        "nav": "operations",
        "verb": verb,
        "note_max": DECISION_NOTE_MAX,
        **detail_context(operation, request.user, page=1),
    }
    if request.method == "GET":
        return render(request, "operations/confirm.html", context)
    note = request.POST.get("note", "")
    try:
        if verb == "approve":
            approve_operation(
                operation, request.user, note=note, warnings_confirmed=request.POST.get("confirm_warnings") == "1"
            )
            messages.success(request, f"Operation #{operation.pk} approved; it runs on queue {operation.host_queue}.")
        else:
            reject_operation(operation, request.user, note=note)
            messages.success(request, f"Operation #{operation.pk} rejected; it will never run.")
    except OperationError as exc:
        title = "Not approved" if verb == "approve" else "Not rejected"
        status = 400 if isinstance(exc, NoteTooLong) else 409
        answer = {**context, "title": title, "message": str(exc)}
        return render(request, "operations/refused.html", answer, status=status)
    url = reverse("operations:detail", args=[operation.pk])
    return HttpResponseClientRedirect(url) if wants_partial(request) else redirect(url)


@require_http_methods(["GET", "POST"])
@login_required
def operation_approve(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the confirmation step; POST: approve and enqueue (403 without ``approve_operation``)."""
    return _decide(request, pk, "approve")


@require_http_methods(["GET", "POST"])
@login_required
def operation_reject(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the confirmation step; POST: reject (403 without ``approve_operation``)."""
    return _decide(request, pk, "reject")


def _selected_operations(values: list[str]) -> list[Operation]:
    """The operations named by the ``op`` values, in their order. ValueError naming a value that is
    not an operation id or an id with no operation."""
    ids = []
    for value in values:
        try:
            ids.append(int(value))
        except ValueError:
            raise ValueError(f"op: must be an operation id, got {json_text(value)}") from None
    found = Operation.objects.select_related("requested_by").in_bulk(ids)
    missing = [pk for pk in ids if pk not in found]
    if missing:
        raise ValueError(f"op: no operation {', '.join(f'#{pk}' for pk in missing)}")
    return [found[pk] for pk in ids]


@require_http_methods(["GET", "POST"])
@login_required
def operation_bulk_approve(request: HttpRequest) -> HttpResponse:
    """``/operations/approve/?op=<pk>&op=...``: GET, the confirmation step listing every selected
    operation with its targets and whether it can be approved now; POST, approve them all or none
    (``operations.services.approve_operations``). 403 without ``approve_operation``, 400 naming a
    bad or unknown ``op``, 409 with the reasons when any cannot be approved."""
    _require_deciding(request.user)
    data = request.POST if request.method == "POST" else request.GET
    try:
        if request.method == "GET":
            check_parameters(data, several=("op",))
        operations = _selected_operations(data.getlist("op"))
        check_bulk_selection(operations)
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    if request.method == "GET":
        rows = bulk_rows(operations, request.user)
        context = {
            "nav": "operations",
            "rows": rows,
            "can_decide": all(row["can_decide"] for row in rows),
            "targets": sum(row["counts"]["total"] for row in rows),
            "note_max": DECISION_NOTE_MAX,
        }
        return render(request, "operations/bulk_confirm.html", context)
    try:
        approved = approve_operations(operations, request.user, note=request.POST.get("note", ""))
    except (OperationError, ValueError) as exc:
        return render(request, "operations/refused.html", {"title": "Not approved", "message": str(exc)}, status=409)
    messages.success(
        request, f"Approved {len(approved)} operations: {', '.join(f'#{op.pk}' for op in approved)}; they run now."
    )
    return redirect(reverse("operations:list"))
