"""The "Why is this job waiting?" page: each waiting request (``scalers.waiting.waiting_requests``),
the cap that refuses it now (``scalers.waiting.CapsNow``), and the reservations holding that cap;
``?job=<id>`` answers for one job first, ``?scaler=<name>`` keeps one scaler's. The groups and why
an ``at-capacity`` request is decided again: docs/admission.md ("Why is this job waiting?").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents.choices import ACTIVE_STATES
from agents.models import Agent
from lib.errors import error_page
from lib.query import check_parameters
from lib.units import format_bytes_iec
from scalers.admission.caps import CapName
from scalers.models import WAITING_WINDOW, ConfigState, Reservation, ScaleOutcome, Scaler, ScaleRequest
from scalers.waiting import CapsNow, waiting_requests

from .common import viewer_required

#: Waiting requests grouped at most (the newest); the page says when there are more.
MAX_REQUESTS = 5000
#: Jobs listed per group (the newest); the group says how many more it holds.
GROUP_ROWS = 50
MAX_HOLDERS = 50
#: Characters of a ``job`` or ``scaler`` parameter taken (a job id is at most 200).
MAX_PARAMETER_CHARS = 200

_CAP_SCOPE: dict[str, str] = {
    CapName.GLOBAL_MAX_AGENTS: "global",
    CapName.GLOBAL_RESOURCE_CAP_CPU: "global",
    CapName.GLOBAL_RESOURCE_CAP_MEMORY: "global",
    CapName.MAX_AGENTS: "scaler",
    CapName.RESOURCE_CAP_CPU: "scaler",
    CapName.RESOURCE_CAP_MEMORY: "scaler",
    CapName.MACHINE_POOL_CPU: "pool",
    CapName.MACHINE_POOL_MEMORY: "pool",
}


@dataclass
class Holder:
    """One reservation holding a cap. ``age_seconds`` since it was created."""

    agent_id: str
    state: str
    age_seconds: float
    owner_instance: str
    cpus: float
    memory_bytes: int
    warm: bool
    job_id: str


@dataclass
class WaitingGroup:
    """Jobs held by the same thing: ``outcome`` + ``cap`` + ``scaler``; ``limit`` describes the cap.
    ``freed``: at-capacity jobs that ``cap`` refused and that no cap would refuse now."""

    outcome: str
    cap: str
    scaler: str
    scope: str
    limit: str
    freed: bool = False
    requests: list = field(default_factory=list)
    #: Requests of the group beyond the :data:`GROUP_ROWS` listed.
    more: int = 0
    holders: list[Holder] = field(default_factory=list)
    holders_total: int = 0
    held_cpus: float = 0.0
    held_memory_bytes: int = 0


def _limit_text(cap: str, scaler: Scaler | None, cfg: ConfigState) -> str:
    if cap == CapName.GLOBAL_MAX_AGENTS:
        return f"globalMaxAgents = {cfg.global_max_agents}"
    if cap == CapName.GLOBAL_RESOURCE_CAP_CPU:
        return f"globalResourceCap.maxCpu = {cfg.global_max_cpu}"
    if cap == CapName.GLOBAL_RESOURCE_CAP_MEMORY:
        return f"globalResourceCap.maxMemory = {format_bytes_iec(cfg.global_max_memory_bytes)}"
    if scaler is None:
        return cap
    if cap == CapName.MAX_AGENTS:
        return f"maxAgents = {scaler.max_agents}"
    if cap == CapName.RESOURCE_CAP_CPU:
        return f"resourceCap.maxCpu = {scaler.max_cpu}"
    if cap == CapName.RESOURCE_CAP_MEMORY:
        return f"resourceCap.maxMemory = {format_bytes_iec(scaler.max_memory_bytes)}"
    pool = scaler.machine_pool
    if pool is None:
        return cap
    if cap == CapName.MACHINE_POOL_CPU:
        return f"machine pool {pool.name}: maxCpu = {pool.max_cpu}"
    return f"machine pool {pool.name}: maxMemory = {format_bytes_iec(pool.max_memory_bytes)}"


def _holders(scope: str, scaler: Scaler | None):
    qs = Reservation.objects.select_related("agent")
    if scope == "scaler":
        qs = qs.filter(scaler=scaler)
    elif scope == "pool":
        qs = qs.filter(machine_pool_id=scaler.machine_pool_id) if scaler and scaler.machine_pool_id else qs.none()
    return qs.order_by("created_at", "id")


def waiting_groups(now=None, *, scaler: str = "", job: str = "") -> list[WaitingGroup]:
    """The page's data (see the module docstring), of ``scaler``'s or ``job``'s requests when
    given: groups ordered by their newest request, the "capacity freed" groups last, each listing
    its newest :data:`GROUP_ROWS` requests and counting the rest in ``more``."""
    now = now or timezone.now()
    cfg = ConfigState.load()
    waiting = waiting_requests(now)
    if scaler:
        waiting = waiting.filter(scaler_name=scaler)
    if job:
        waiting = waiting.filter(job_id=job)
    requests = list(waiting.order_by("-decided_at")[:MAX_REQUESTS])
    scalers = {
        s.name: s
        for s in Scaler.objects.select_related("machine_pool").filter(name__in={r.scaler_name for r in requests})
    }
    caps_now = CapsNow.read() if any(r.outcome == ScaleOutcome.AT_CAPACITY for r in requests) else None
    groups: dict[tuple[str, str, str, bool], WaitingGroup] = {}
    for r in requests:
        cap, freed = r.cap, False
        if r.outcome == ScaleOutcome.AT_CAPACITY:
            assert caps_now is not None, "read above whenever a request is at capacity"
            now_cap = caps_now.refusing_cap(r.scaler_name, r.cpus, r.memory_bytes, r.cap)
            if now_cap is None:
                freed = True
            else:
                cap = now_cap
        key = (r.outcome, cap, r.scaler_name if _CAP_SCOPE.get(cap) != "global" else "", freed)
        group = groups.get(key)
        if group is None:
            scaler_row = scalers.get(r.scaler_name)
            scope = _CAP_SCOPE.get(cap, "") if r.outcome != ScaleOutcome.EXCEEDS_CAP and not freed else ""
            group = WaitingGroup(
                outcome=r.outcome,
                cap=cap,
                scaler=key[2],
                scope=scope,
                limit=_limit_text(cap, scaler_row, cfg) if cap else "",
                freed=freed,
            )
            if scope:
                qs = _holders(scope, scaler_row)
                group.holders_total = qs.count()
                for res in qs[:MAX_HOLDERS]:
                    group.holders.append(
                        Holder(
                            agent_id=res.agent.agent_id,
                            state=res.agent.state,
                            age_seconds=(now - res.created_at).total_seconds(),
                            owner_instance=res.owner_instance,
                            cpus=res.cpus,
                            memory_bytes=res.memory_bytes,
                            warm=res.agent.warm,
                            job_id=res.agent.bound_job_id,
                        )
                    )
                agg = [(h.cpus, h.memory_bytes) for h in group.holders]
                group.held_cpus = sum(c for c, _ in agg)
                group.held_memory_bytes = sum(m for _, m in agg)
            groups[key] = group
        if len(group.requests) < GROUP_ROWS:
            group.requests.append(r)
        else:
            group.more += 1
    return sorted(groups.values(), key=lambda g: g.freed)


@dataclass
class JobAnswer:
    """Why one job waits, or that it does not: its latest decision (``record``, None when the
    console never decided it within the window), the active agent serving it, and the group
    holding it when it waits."""

    job_id: str
    record: ScaleRequest | None
    agent: Agent | None
    group: WaitingGroup | None


def job_answer(job_id: str, now=None) -> JobAnswer:
    """The answer for ``job_id`` (see :class:`JobAnswer`)."""
    now = now or timezone.now()
    record = ScaleRequest.objects.filter(job_id=job_id, decided_at__gte=now - WAITING_WINDOW).first()
    agent = Agent.objects.filter(bound_job_id=job_id, state__in=ACTIVE_STATES).order_by("-created_at").first()
    groups = waiting_groups(now, job=job_id)
    return JobAnswer(job_id, record, agent, groups[0] if groups else None)


def _parameter(request, name: str) -> str:
    value = (request.GET.get(name) or "").strip()
    if len(value) > MAX_PARAMETER_CHARS:
        raise ValueError(f"{name}: at most {MAX_PARAMETER_CHARS} characters, got {len(value)}")
    return value


@require_GET
@viewer_required
def why_waiting(request):
    """``GET /scalers/why-waiting/[?job=<id>][&scaler=<name>]``: login and ``agents.view_agent``
    required, like every page; 400 naming a bad, unknown or repeated parameter."""
    try:
        check_parameters(request.GET, single=("job", "scaler"))
        job, scaler = _parameter(request, "job"), _parameter(request, "scaler")
    except ValueError as exc:
        return error_page(request, 400, str(exc))
    now = timezone.now()
    groups = waiting_groups(now, scaler=scaler)
    total = waiting_requests(now).filter(scaler_name=scaler).count() if scaler else waiting_requests(now).count()
    listed = sum(len(g.requests) + g.more for g in groups)
    return render(
        request,
        "scalers/why_waiting.html",
        {
            "groups": groups,
            "nav": "waiting",
            "window_hours": int(WAITING_WINDOW.total_seconds() // 3600),
            "n_requests": total,
            "n_unlisted": total - listed,
            "n_freed": sum(len(g.requests) + g.more for g in groups if g.freed),
            "job": job,
            "scaler": scaler,
            "answer": job_answer(job, now) if job else None,
        },
    )
