"""Operator pages for agents: dashboard, agents list, agent page, console page, events feed.

Every page needs a signed-in user with ``agents.view_agent`` (anonymous users are sent to the login
page, signed-in users without the permission get 403). htmx requests (not boosted) get the named
partial of the same template instead of the whole page, so a table re-fetch and the first render
share their markup.
"""

from __future__ import annotations

import ipaddress
import logging
from functools import wraps

from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from scalers.models import Scaler

from .capacity import global_capacity, pool_capacities, scaler_capacities
from .choices import ACTIVE_STATES, AgentState, EventType
from .models import Agent, ScalerEvent

log = logging.getLogger(__name__)

VIEW_PERM = "agents.view_agent"
#: Running the live isolation self-test sends probe packets from inside the agent's namespace:
#: an operator's action (the "operators" group of operations.roles has request_operation).
SELFTEST_PERMS = ("operations.request_operation", "agents.change_agent")


def can_run_selftest(user) -> bool:
    """Operators (``operations.request_operation``) or users with ``agents.change_agent``."""
    return any(user.has_perm(p) for p in SELFTEST_PERMS)

DASHBOARD_AGENT_LIMIT = 200
DASHBOARD_EVENT_LIMIT = 30
LIST_PAGE_SIZE = 100
EVENTS_PAGE_SIZE = 200


def viewer_required(view):
    """``login_required`` + ``agents.view_agent`` (403 for a signed-in user without it)."""
    return login_required(permission_required(VIEW_PERM, raise_exception=True)(wraps(view)(view)))


def wants_partial(request) -> bool:
    """True for an htmx request that is not a boosted page navigation (NetBox's rule)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted


def template_exists(name: str) -> bool:
    try:
        get_template(name)
    except TemplateDoesNotExist:
        return False
    return True


def css_attr_selector(attr: str, value: str) -> str:
    """``[attr="value"]`` with ``value`` escaped as a CSS string (for ``data-accept`` filters)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'[{attr}="{escaped}"]'


RECOVERY_COUNTS = (
    ("spawning_dropped", "spawning dropped"),
    ("reservations_dropped", "reservations dropped"),
    ("buffered_events_lost", "buffered events lost"),
    ("spawning_agents_rehydrated", "spawning rehydrated"),
    ("reservations_rehydrated", "reservations rehydrated"),
    ("agent_jobs_rehydrated", "agent jobs rehydrated"),
)


def recovery_report() -> dict | None:
    """The latest recovery run's counts (helper "adm"'s ``scalers.models.RecoveryReport``, written at
    every boot and leader change, SPEC c.5), or None when there is none.

    Returns ``{"at", "trigger", "instance", "counts": [(label, n)], "dropped": int, "error"}``;
    ``dropped`` sums what recovery threw away (shown as a warning when not zero).
    """
    try:
        from scalers.models import RecoveryReport
    except ImportError:  # pragma: no cover - admission not in this build
        return None
    report = RecoveryReport.objects.first()
    if report is None:
        return None
    counts = [(label, getattr(report, name, 0)) for name, label in RECOVERY_COUNTS]
    dropped = report.spawning_dropped + report.reservations_dropped + report.buffered_events_lost
    return {
        "at": report.created_at,
        "trigger": report.trigger,
        "instance": report.instance_id,
        "counts": counts,
        "dropped": dropped,
        "error": report.error,
    }


# --- dashboard ----------------------------------------------------------------------------------


@require_GET
@viewer_required
def dashboard(request):
    """``/``: capacity per scaler (and pools, and the console), live agents, recent events."""
    agents = list(Agent.objects.active().select_related("scaler")[:DASHBOARD_AGENT_LIMIT])
    events = ScalerEvent.objects.all()[:DASHBOARD_EVENT_LIMIT]
    url = reverse("dashboard")
    ctx = {
        "agent_limit": DASHBOARD_AGENT_LIMIT,
        "nav": "dashboard",
        "agents": agents,
        "events": events,
        "max_rows": DASHBOARD_EVENT_LIMIT,
        "empty_text": "No live agents.",
    }
    part = request.GET.get("part")
    if part == "agents":
        return render(request, "dashboard/index.html#agent_tbody", {**ctx, "resync_url": f"{url}?part=agents"})
    if part == "events":
        return render(request, "dashboard/index.html#event_tbody", {**ctx, "resync_url": f"{url}?part=events"})
    ctx.update(
        global_cap=global_capacity(),
        pool_caps=pool_capacities(),
        scaler_caps=scaler_capacities(Scaler.objects.filter(Q(retiring=False) | Q(agents__state__in=ACTIVE_STATES)).distinct()),
        recovery=recovery_report(),
        agent_resync_url=f"{url}?part=agents",
        event_resync_url=f"{url}?part=events",
    )
    return render(request, "dashboard/index.html", ctx)


# --- agents list --------------------------------------------------------------------------------

STATE_FILTERS = [("active", "active"), ("all", "all states"), *[(s.value, s.value) for s in AgentState]]


def filter_agents(params) -> tuple:
    """Apply the list filters ``state`` (a state, ``active`` or ``all``; default active), ``scaler``
    (name) and ``q`` (substring of agent id, managed id, address, bound job, or a label) to agents.

    Returns ``(queryset, cleaned)`` with ``cleaned`` the values actually applied (unknown ones dropped).
    """
    qs = Agent.objects.select_related("scaler")
    state = params.get("state") or "active"
    if state == "active":
        qs = qs.filter(state__in=ACTIVE_STATES)
    elif state in AgentState.values:
        qs = qs.filter(state=state)
    else:
        state = "all"
    scaler = (params.get("scaler") or "").strip()
    if scaler:
        qs = qs.filter(scaler__name=scaler)
    q = (params.get("q") or "").strip()[:200]
    if q:
        cond = Q(agent_id__icontains=q) | Q(managed_id__icontains=q) | Q(bound_job_id__icontains=q) | Q(labels__contains=[q])
        try:
            cond |= Q(ip=str(ipaddress.ip_address(q)))
        except ValueError:
            pass
        qs = qs.filter(cond)
    return qs, {"state": state, "scaler": scaler, "q": q}


@require_GET
@viewer_required
def agent_list(request):
    """``/agents/``: every agent with filters; htmx requests get only the table."""
    qs, cleaned = filter_agents(request.GET)
    page = Paginator(qs, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    ctx = {
        "nav": "agents",
        "page": page,
        "agents": page.object_list,
        "filters": cleaned,
        "state_filters": STATE_FILTERS,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
        "query": query.urlencode(),
        "empty_text": "No agent matches these filters.",
    }
    if wants_partial(request):
        return render(request, "agents/list.html#results", ctx)
    return render(request, "agents/list.html", ctx)


# --- agent page ---------------------------------------------------------------------------------


def _get_agent(agent_id: str) -> Agent:
    return get_object_or_404(Agent.objects.select_related("scaler", "label_set"), agent_id=agent_id)


def host_access_view(agent: Agent) -> dict:
    """What the agent page says about host access (issue 5 item 7).

    ``entries``: the resolved list stored at spawn (None when not resolved yet); ``explicit``: the
    label set's explicit list was used (else the default, SPEC g.3); ``label_set_entries`` /
    ``label_set_explicit``: what the label set says now; ``drift``: the two differ, so a host-access
    change is waiting to be applied to this agent.
    """
    ls = agent.label_set
    ls_entries = ls.host_access if ls is not None else None
    drift = False
    if ls is not None and agent.host_access is not None:
        if ls_entries is not None:
            drift = (not agent.host_access_explicit) or list(ls_entries) != list(agent.host_access)
        else:
            drift = agent.host_access_explicit
    return {
        "entries": agent.host_access,
        "explicit": agent.host_access_explicit,
        "label_set_entries": ls_entries,
        "label_set_explicit": ls_entries is not None,
        "drift": drift,
    }


def ops_request_available() -> bool:
    return template_exists("operations/request_button.html")


@require_GET
@viewer_required
def agent_detail(request, agent_id: str):
    """``/agents/<agent_id>/``: state, labels, timestamps, host access, rules in force, timeline."""
    agent = _get_agent(agent_id)
    events = ScalerEvent.objects.filter(Q(agent=agent) | Q(agent_ref=agent.agent_id)).order_by("-created_at", "-id")[:500]
    if request.GET.get("part") == "events":
        return render(request, "dashboard/index.html#event_tbody", {"events": events, "max_rows": 500, "resync_url": request.get_full_path()})
    ctx = {
        "nav": "agents",
        "agent": agent,
        "agents": [agent],
        "events": events,
        "max_rows": 500,
        "host_access": host_access_view(agent),
        "ops_buttons": ops_request_available(),
        "can_selftest": can_run_selftest(request.user),
        "selftest_available": selftest_function() is not None,
        "streams": console_streams(agent),
        "event_resync_url": f"{reverse('agent_detail', args=[agent.agent_id])}?part=events",
    }
    return render(request, "agents/detail.html", ctx)


@require_GET
@viewer_required
def agent_isolation(request, agent_id: str):
    """Fragment: the agent's isolation rules read back from the kernel (loaded after the page)."""
    agent = _get_agent(agent_id)
    from .selftest import isolation_context

    ctx = {"agent": agent, "table": isolation_context(agent).table, "lines": None, "error": "", "complete": None}
    if not agent.ip:
        ctx["error"] = "the agent has no address yet, so it has no isolation rules"
    else:
        try:
            from network.nft.apply import NftClient

            rules = NftClient(ctx["table"]).list_agents().get(ipaddress.ip_address(agent.ip))
        except Exception as exc:  # noqa: BLE001 - nft missing, no privilege, bad table: say so
            ctx["error"] = f"could not read table inet {ctx['table']}: {exc}"
        else:
            if rules is None:
                ctx["lines"] = []
            else:
                ctx["lines"] = rules.describe()
                ctx["complete"] = rules.complete
    return render(request, "agents/detail.html#isolation", ctx)


def selftest_function():
    """The self-test runner for this build (``agents.selftest.run_agent_selftest`` over helper
    "net"'s ``network.selftest``), or None when net's module is missing."""
    try:
        import network.selftest  # noqa: F401
    except ImportError:
        return None
    from .selftest import run_agent_selftest

    return run_agent_selftest


def selftest_rows(results) -> list[dict]:
    """``network.selftest.ProbeResult`` list → table rows ``{target, why, expected, observed, ok,
    detail, ms}``; ``ok`` is True / False, or None when a UDP probe cannot tell."""
    rows = []
    for r in results:
        rows.append(
            {
                "target": str(r.target),
                "why": r.target.label,
                "expected": "reachable" if r.target.expect_reachable else "blocked",
                "observed": r.state,
                "ok": r.passed,
                "detail": r.detail,
                "ms": round(r.elapsed_s * 1000),
            }
        )
    return rows


@require_POST
@viewer_required
def agent_selftest(request, agent_id: str):
    """POST: run the live isolation self-test for this agent and render the reachability table.

    Needs ``operations.request_operation`` or ``agents.change_agent`` (it sends probe packets from
    inside the agent's namespace).
    Refusals render as a message in the fragment, never a 500."""
    agent = _get_agent(agent_id)
    ctx = {"agent": agent}
    if not can_run_selftest(request.user):
        ctx["error"] = "running the self-test needs the permission operations.request_operation (operators)"
        return render(request, "agents/detail.html#selftest", ctx, status=403)
    fn = selftest_function()
    if fn is None:
        ctx["error"] = "the isolation self-test is not available in this build"
    elif not agent.is_active or not agent.ip:
        ctx["error"] = f"agent {agent.agent_id} is {agent.state} and has {'address ' + agent.ip if agent.ip else 'no address'}: nothing to probe"
    else:
        try:
            rows = selftest_rows(fn(agent))
        except Exception as exc:  # noqa: BLE001 - show why, never a 500 in a fragment
            log.info("isolation self-test for %s could not run: %s", agent.agent_id, exc)
            ctx["error"] = f"the self-test could not run: {exc}"
        else:
            ctx.update(rows=rows, failed=sum(1 for r in rows if r["ok"] is False), unknown=sum(1 for r in rows if r["ok"] is None))
            ctx["passed"] = bool(rows) and ctx["failed"] == 0
    return render(request, "agents/detail.html#selftest", ctx)


# --- console ------------------------------------------------------------------------------------


_STREAM_TITLES = {"serial": "Serial console", "vmm": "VMM log", "console": "Console"}


def console_streams(agent: Agent) -> list[tuple[str, str]]:
    """``[(stream, label)]`` the console page offers (``agents.consumers.console_streams_of``)."""
    from .consumers import console_streams_of

    return [(name, _STREAM_TITLES[name]) for name in console_streams_of(agent)]


@require_GET
@viewer_required
def agent_console(request, agent_id: str, stream: str | None = None):
    """``/agents/<id>/console/[<stream>/]``: the live console with follow, search, download, links."""
    agent = _get_agent(agent_id)
    streams = console_streams(agent)
    names = [s for s, _ in streams]
    if stream is None:
        stream = names[0]
    elif stream not in names:
        raise Http404(f"agent {agent.agent_id} has no stream {stream!r}; it has {', '.join(names)}")
    ctx = {
        "nav": "agents",
        "agent": agent,
        "agents": [agent],
        "stream": stream,
        "streams": streams,
        "ws_url": f"/ws/agents/{agent.agent_id}/console/{stream}/",
        "download_url": download_url(agent, stream),
    }
    return render(request, "agents/console.html", ctx)


def download_url(agent: Agent, stream: str) -> str:
    return reverse("agent_console_download", args=[agent.agent_id, stream])


def _docker_log_chunks(agent: Agent):
    from scalers.backends.runtime import docker_client_for, runtime_for_scaler

    container = docker_client_for(runtime_for_scaler(agent.scaler)).containers.get(agent.managed_id or agent.agent_id)
    stream = container.logs(stream=True, follow=False, stdout=True, stderr=True)
    try:
        yield from stream
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


@require_GET
@viewer_required
def agent_console_download(request, agent_id: str, stream: str):
    """``/agents/<id>/console/<stream>/download``: the whole log as a text attachment.

    File-backed streams are sent as they are on disk (bytes, never decoded); a container's
    ``console`` without a file is its docker logs (stdout and stderr), streamed."""
    from django.http import FileResponse, HttpResponse, StreamingHttpResponse

    agent = _get_agent(agent_id)
    if stream not in [s for s, _ in console_streams(agent)]:
        raise Http404(f"agent {agent.agent_id} has no stream {stream!r}")
    filename = f"{agent.agent_id}-{stream}.log"
    from .consumers import console_log_file

    path = console_log_file(agent, stream)
    if path is not None:
        try:
            handle = open(path, "rb")  # noqa: SIM115 - FileResponse closes it
        except FileNotFoundError:
            raise Http404(f"{path} does not exist (yet)") from None
        except OSError as exc:
            return HttpResponse(f"could not read {path}: {exc}\n", status=502, content_type="text/plain; charset=utf-8")
        return FileResponse(handle, as_attachment=True, filename=filename, content_type="text/plain; charset=utf-8")
    if agent.scaler.type != "container":
        raise Http404(f"agent {agent.agent_id} ({agent.scaler.type}) has no console log to download")
    try:
        chunks = _docker_log_chunks(agent)
        first = next(chunks, b"")
    except Exception as exc:  # noqa: BLE001 - docker down or the container is gone
        return HttpResponse(f"could not read the container's logs: {exc}\n", status=502, content_type="text/plain; charset=utf-8")

    def body():
        yield first
        yield from chunks

    response = StreamingHttpResponse(body(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# --- events feed ----------------------------------------------------------------------------------


@require_GET
@viewer_required
def event_list(request):
    """``/events/``: the global event feed, newest first, live; filters ``type``, ``scaler``, ``q``."""
    qs = ScalerEvent.objects.all()
    etype = request.GET.get("type") or ""
    if etype in EventType.values:
        qs = qs.filter(type=etype)
    else:
        etype = ""
    scaler = (request.GET.get("scaler") or "").strip()
    if scaler:
        qs = qs.filter(scaler_name=scaler)
    q = (request.GET.get("q") or "").strip()[:200]
    if q:
        qs = qs.filter(Q(agent_ref__icontains=q) | Q(detail__icontains=q))
    filtered = bool(etype or scaler or q)
    events = qs[:EVENTS_PAGE_SIZE]
    accept = "".join(
        css_attr_selector(attr, value) for attr, value in (("data-type", etype), ("data-scaler", scaler)) if value
    )
    ctx = {
        "accept": accept,
        "nav": "events",
        "events": events,
        "max_rows": EVENTS_PAGE_SIZE,
        "filters": {"type": etype, "scaler": scaler, "q": q},
        "filtered": filtered,
        "event_types": EventType.choices,
        "scaler_names": list(Scaler.objects.values_list("name", flat=True)),
    }
    if wants_partial(request):
        return render(request, "agents/events.html#results", ctx)
    return render(request, "agents/events.html", ctx)

