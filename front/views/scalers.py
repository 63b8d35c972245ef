"""Operator pages for scalers: list, detail with label sets, and the label-set host-access editor.

Viewing needs ``agents.view_agent`` (see ``front.views.common.viewer_required``). Applying a host-access
change never writes rules or the label set here: it asks for a planned ``host-access-apply``
operation, which a person approves and a worker runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from agents.choices import ACTIVE_STATES
from agents.listing import filter_agents
from agents.models import Agent, ScalerEvent
from lib.errors import error_page
from lib.htmx import wants_partial
from lib.query import check_parameters, choice
from operations.choices import OperationKind
from operations.models import Finding
from operations.presenters import evidence_items
from operations.services import create_operation
from scalers.capacity import listed_scaler_capacities, scaler_capacities
from scalers.choices import ScalerType
from scalers.models import ConfigState, LabelSet, Pause, Scaler
from scalers.pauses import MAX_REASON, pause_of
from scalers.samples import CHART_RANGES, DEFAULT_CHART_RANGE, chart_bucket_seconds, recent_samples
from scalers.warm_schedule import size_now

from ..charts import scaler_charts
from ..host_access_editor import (
    DEFAULT,
    EXPLICIT,
    MAX_TEXT_BYTES,
    effective_host_access,
    gateway_for,
    input_limit_error,
    plan_host_access_change,
)
from .common import css_attr_selector, viewer_required

log = logging.getLogger(__name__)

HOST_ACCESS_KIND = "host-access-apply"
REQUEST_PERM = "operations.request_operation"
#: Live agents the scaler page lists (newest first); ``/agents/?scaler=<name>`` pages through the others.
SCALER_AGENT_LIMIT = 25


@dataclass(frozen=True)
class LabelSetRow:
    """A label set as the scaler page lists it: its live agents (``n_active``), what it runs
    (``backend_summary``: image, rootfs or command) and whether its agents keep CAP_NET_RAW."""

    label_set: LabelSet
    n_active: int
    backend_summary: str
    net_raw: bool


@require_GET
@viewer_required
def scaler_list(request):
    """``/scalers/``: every scaler with its capacity and label-set count."""
    return render(request, "scalers/list.html", {"nav": "scalers", "caps": listed_scaler_capacities()})


def _scaler(name: str) -> Scaler:
    return get_object_or_404(Scaler.objects.select_related("machine_pool"), name=name)


#: The chart range picker's choices: ``?range=`` value and its label, in order.
RANGE_LABELS = {"1h": "1 h", "6h": "6 h", "24h": "24 h", "7d": "7 d"}
#: How each range reads in the charts' heading.
RANGE_HEADINGS = {"1h": "Last hour", "6h": "Last 6 hours", "24h": "Last 24 hours", "7d": "Last 7 days"}


def _chart_context(scaler: Scaler, range_key: str, now: datetime) -> dict[str, Any]:
    """The capacity charts of ``scaler`` over ``range_key`` (a key of ``CHART_RANGES``) and their picker."""
    window = CHART_RANGES[range_key]
    every = settings.KICI_CAPACITY_SAMPLE_SECONDS
    samples = recent_samples(scaler, window, now, every)
    gap_unit = chart_bucket_seconds(window, every)  # a bucket is one point: lines break past 2.5 of them
    return {
        "charts": scaler_charts(samples, start=now - window, end=now, sample_seconds=gap_unit) if samples else [],
        "sample_every": "minute" if every == 60 else f"{every} s",
        "chart_range": range_key,
        "chart_heading": RANGE_HEADINGS[range_key],
        "chart_ranges": list(RANGE_LABELS.items()),
    }


@require_GET
@viewer_required
def scaler_detail(request, name: str):
    """``/scalers/<name>/``: caps, configuration, what the detection found (orphans, stale rules),
    capacity samples as charts over ``?range=`` (1h, 6h, 24h or 7d; 24h by default), label sets with
    host access (and, where the console's value is in force, the file's beside it), live agents,
    events. ``?part=findings``: only the "Found" panel (the page re-fetches it); ``?part=pause``:
    only the Pause panel (re-fetched when the page's pause banner changes); any other htmx request
    gets the charts alone (the range picker). 400 naming any other parameter, part or range."""
    try:
        check_parameters(request.GET, single=("part", "range"))
        part = choice("part", request.GET.get("part"), ("findings", "pause"))
        range_key = choice("range", request.GET.get("range"), tuple(CHART_RANGES)) or DEFAULT_CHART_RANGE
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    scaler = _scaler(name)
    if part == "findings":
        return render(request, "scalers/detail.html#findings", {"scaler": scaler, **_findings_context(scaler)})
    if part == "pause":
        return render(request, "scalers/pause_panel.html", {"scaler": scaler, **_pause_context(scaler)})
    now = timezone.now()
    charts = _chart_context(scaler, range_key, now)
    if wants_partial(request):
        return render(request, "scalers/detail.html#charts", {"scaler": scaler, **charts})
    label_sets = list(scaler.label_sets.order_by("index"))
    active = Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES)
    n_active = dict(active.order_by().values_list("label_set").annotate(n=Count("id")))
    rows = [_label_set_row(scaler, ls, n_active.get(ls.pk, 0)) for ls in label_sets]
    agents = filter_agents({"state": "active", "scaler": scaler.name})[0][:SCALER_AGENT_LIMIT]  # as its row view
    events = ScalerEvent.objects.filter(scaler_name=scaler.name)[:50]
    warm = (scaler.config or {}).get("warmPool") or {}
    ctx = {
        **_findings_context(scaler),
        "nav": "scalers",
        "scaler": scaler,
        **_pause_context(scaler),
        "warm_now": size_now(warm, now) if scaler.warm_pool_enabled and warm.get("schedule") else None,
        "warm_zone": warm.get("timeZone") or "UTC",
        "cap": scaler_capacities([scaler])[0],
        "label_sets": rows,
        "agents": agents,
        "agent_limit": SCALER_AGENT_LIMIT,
        "events": events,
        "max_rows": 50,
        "empty_text": "No live agents on this scaler.",
        "config_items": _config_items(scaler),
        "config_state": ConfigState.load(),
        "net_raw": [row.label_set for row in rows if row.net_raw and not row.label_set.retired],
        "overridden": [ls for ls in label_sets if ls.host_access_override and not ls.retired],
        "differing": [ls for ls in label_sets if ls.host_access_differs and not ls.retired],
        "accept": css_attr_selector("data-scaler", scaler.name),
        **charts,
    }
    return render(request, "scalers/detail.html", ctx)


def _label_set_row(scaler: Scaler, label_set: LabelSet, n_active: int) -> LabelSetRow:
    cfg = label_set.config or {}
    return LabelSetRow(
        label_set=label_set,
        n_active=n_active,
        backend_summary=cfg.get("image") or cfg.get("rootfsPath") or cfg.get("command") or "",
        net_raw=_grants_net_raw(scaler, cfg),
    )


#: Seconds between two re-fetches of a scaler page's "Found" panel (a sweeper round is 5 s).
FINDINGS_POLL_SECONDS = 5


def _pause_context(scaler: Scaler) -> dict:
    """The Pause panel's context: the pause holding the scaler, whether its host is paused, the
    longest reason."""
    return {
        "pause": pause_of(scaler),
        "host_paused": Pause.objects.filter(host=scaler.host).exclude(host="").exists(),
        "max_reason": MAX_REASON,
    }


def _findings_context(scaler: Scaler) -> dict:
    """The "Found" panel's context: the scaler's findings with their evidence, one "Preview …"
    per kind found (a dry run; "Request approval" is on its page)."""
    findings = list(Finding.objects.filter(scaler=scaler))
    for finding in findings:
        finding.evidence_items = evidence_items(finding.evidence)
    kinds = dict.fromkeys(f.kind for f in findings)
    return {
        "findings": findings,
        "finding_kinds": [(kind, f"Preview {OperationKind(kind).label.lower()}…") for kind in kinds],
        "findings_poll_seconds": FINDINGS_POLL_SECONDS,
    }


def _grants_net_raw(scaler: Scaler, label_set_config: dict) -> bool:
    """The label set's ``netRaw: true`` gives its agent containers CAP_NET_RAW back (a Firecracker
    guest or a host process has no container to give it to)."""
    return (
        label_set_config.get("netRaw") is True
        and scaler.type in (ScalerType.CONTAINER, ScalerType.BARE_METAL)
        and not label_set_config.get("binaryPath")
    )


#: The type-specific settings of a scaler entry (``scalers.config.schema.ScalerEntry``), in the
#: order the Configuration panel shows them. Every entry carries every type's fields with their
#: defaults, so the panel picks its type's only; the shared ones have their own rows.
TYPE_FIELDS = {
    "container": ("host", "socketPath", "runtime", "extraHosts", "networkIsolation"),
    # bare-metal runs container-mode label sets through the container backend's settings
    "bare-metal": ("enforceCgroups", "host", "socketPath", "runtime", "extraHosts", "networkIsolation"),
    "firecracker": (
        "firecrackerPath",
        "jailerPath",
        "kernelPath",
        "initrdPath",
        "chrootBaseDir",
        "uid",
        "gid",
        "vcpuCount",
        "memSizeMib",
        "requireSudo",
    ),
    "event": ("provisioningTargets", "claimTtlSeconds", "agentTokenTtlSeconds"),
}


def _config_items(scaler: Scaler) -> list[tuple[str, object]]:
    """The settings of the scaler's own type, once each, as ``(key, text)`` from its imported
    config (:data:`TYPE_FIELDS`); unset ones are left out, lists joined with ", "."""
    config = scaler.config or {}
    items = []
    for key in TYPE_FIELDS.get(scaler.type, ()):
        value = config.get(key)
        if value is None:
            continue
        if key == "networkIsolation" and scaler.type == "bare-metal" and value is False:
            value = "false (ignored: container mode is always isolated)"
        elif isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "none"
        items.append((key, value))
    return items


def _label_set(name: str, index: int) -> LabelSet:
    return get_object_or_404(LabelSet.objects.select_related("scaler"), scaler__name=name, index=index)


def _initial_text(label_set: LabelSet) -> str:
    """The editor's first entries: the list in force (for a default label set, the default as
    resolved for its scaler), so switching to "Explicit list" starts from it, not from nothing."""
    return "\n".join(effective_host_access(label_set, label_set.host_access))


def _editor_context(request, label_set: LabelSet, mode: str, text: str) -> dict:
    plan = plan_host_access_change(label_set, mode, text)
    return {
        "nav": "scalers",
        "scaler": label_set.scaler,
        "label_set": label_set,
        "mode": mode,
        "text": text,
        "plan": plan,
        "current_effective": effective_host_access(label_set, label_set.host_access),
        # the examples name the agents' gateway: an entry opens ports on this host's addresses only
        "gateway": gateway_for(label_set.scaler),
        "can_apply": request.user.has_perm(REQUEST_PERM),
        "preview_url": reverse("host_access_preview", args=[label_set.scaler.name, label_set.index]),
        "apply_url": reverse("host_access_apply", args=[label_set.scaler.name, label_set.index]),
    }


@require_GET
@viewer_required
def host_access_editor(request, name: str, index: int):
    """``/scalers/<name>/label-sets/<index>/host-access/``: edit, preview, and request an apply."""
    label_set = _label_set(name, index)
    mode = EXPLICIT if label_set.host_access is not None else DEFAULT
    return render(
        request, "scalers/host_access.html", _editor_context(request, label_set, mode, _initial_text(label_set))
    )


#: Bytes of a host-access form besides its entries (mode, CSRF token, field names).
FORM_OVERHEAD_BYTES = 4096


def _over_limit(request):
    """The refusal (413 / 422, naming the limit) of a host-access form over the editor's limits
    (``front.host_access_editor.input_limit_error``); a body too big is refused unread."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_TEXT_BYTES + FORM_OVERHEAD_BYTES:
        message = f"the form is {length} bytes: entries are at most {MAX_TEXT_BYTES} bytes; nothing was done"
        return error_page(request, 413, message, title="Too many entries")
    limit = input_limit_error(request.POST.get("entries", ""))
    if limit is not None:
        return error_page(request, limit[0], limit[1], title="Too many entries")
    return None


@require_POST
@viewer_required
def host_access_preview(request, name: str, index: int):
    """POST-only, side-effect free: validate the typed entries and render the preview fragment.
    Input over the editor's limits is refused (413 / 422) before any entry is parsed."""
    if (refusal := _over_limit(request)) is not None:
        return refusal
    label_set = _label_set(name, index)
    ctx = _editor_context(request, label_set, request.POST.get("mode", ""), request.POST.get("entries", ""))
    return render(request, "scalers/host_access.html#preview", ctx)


@require_POST
@viewer_required
def host_access_apply(request, name: str, index: int):
    """Re-validate with the same planning function, then ask for a planned ``host-access-apply``
    operation and redirect to it. Bad entries, and warned entries without ``confirm_warnings=1``,
    re-render the editor (422) and nothing is requested."""
    if (refusal := _over_limit(request)) is not None:
        return refusal
    label_set = _label_set(name, index)
    mode = request.POST.get("mode", "")
    text = request.POST.get("entries", "")
    ctx = _editor_context(request, label_set, mode, text)
    plan = ctx["plan"]
    if not plan.ok:
        # Name what is wrong: a bad mode or too many entries mark no entry below.
        problems = plan.general_errors + (["fix the entries marked below"] if plan.refused else [])
        ctx["apply_error"] = f"Nothing was applied: {'; '.join(problems)}."
        return render(request, "scalers/host_access.html", ctx, status=422)
    if plan.unchanged:
        ctx["apply_error"] = "Nothing was applied: this is what the label set already has."
        return render(request, "scalers/host_access.html", ctx, status=422)
    if not request.user.has_perm(REQUEST_PERM):
        raise PermissionDenied(f"requesting an operation needs the permission {REQUEST_PERM}")
    if plan.warnings and request.POST.get("confirm_warnings") != "1":
        # An entry that opens nothing, or every port of the host, is applied only knowingly.
        n = len(plan.warnings)
        ctx["apply_error"] = f"Nothing was applied: confirm the {n} warning{'s' if n != 1 else ''} below first."
        return render(request, "scalers/host_access.html", ctx, status=422)
    params = {"host_access": plan.entries}  # None = back to the default (operations.kinds.host_access_apply)
    try:
        operation = create_operation(HOST_ACCESS_KIND, {"label_set": label_set, "params": params}, request.user)
    except PermissionDenied:
        raise
    except Exception as exc:  # noqa: BLE001 - NothingToDo, ScopeInvalid, planner errors: all say why
        log.info("host-access apply for %s refused: %s", label_set, exc)
        ctx["apply_error"] = f"Nothing was applied: {exc}"
        return render(request, "scalers/host_access.html", ctx, status=422)
    if operation.reused:
        messages.info(request, f"An identical planned operation already exists: #{operation.pk}.")
    return redirect(reverse("operations:detail", args=[operation.pk]))
