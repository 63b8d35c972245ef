"""Giving capacity back: ``release`` and every path that leads to it.

The rule for "a failed agent stops counting unless its sandbox still runs": an agent counts
through its reservation row (and while it is in an active state). :func:`teardown_agent` removes
the sandbox through the backend first and deletes the reservation only once ``destroy`` returned;
when ``destroy`` raises, the agent stays ``destroying`` *with* its reservation, so capacity that
may still be in use stays billed, and the sweeper retries (:func:`retry_stuck_teardowns`).
A sandbox that was never created (no ``managed_id``, local backend) has nothing to remove.

Release paths and their ``reason``:

* the spawn job failed and its backend cleaned up: :func:`fail_spawn` with ``cleaned_up=True``
  (``spawn-failed``, ``spawn-timeout``), called by ``scalers.jobs.spawn_agent``;
* rq job crash or timeout / worker killed: :func:`on_spawn_job_failure` (``spawn-job-failed``),
  attached by ``scalers.jobs`` as the spawn job's ``on_failure``; a killed worker's job reaches
  it through rq's abandoned-job cleanup, and :func:`reap_failed_spawn_jobs` checks rq for the rest;
* destroy: :func:`teardown_agent` (any reason);
* registration deadline reached: ``scalers.jobs.expire_spawn`` calls :func:`fail_spawn`
  (``spawn-timeout``);
* agent never registered within its token TTL: :func:`expire_unregistered_agents`
  (``token-expired``);
* stale prune: :func:`prune_stale_spawns` (``stale-prune``);
* a spawn that could not be enqueued: ``scalers.jobs.enqueue_spawn_or_fail`` (``enqueue-failed``).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import django_rq
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone
from rq.job import Job, JobStatus

from agents.choices import ACTIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent, ScalerEvent
from agents.tokens import revoke_agent_tokens
from scalers.backends.factory import get_backend
from scalers.backends.failure import failure_detail, mark_spawn_failed
from scalers.choices import LOCAL_SCALER_TYPES, ScalerType

log = logging.getLogger("scalers.admission")

#: Minimum stale-prune window in seconds: the window is ``max(spawnTimeout, 300 s)``.
MIN_STALE_WINDOW_SECONDS = 300


def release(agent_id: str, reason: str) -> bool:
    """Delete the reservation of ``agent_id``; True if one was held, False if already released.

    Idempotent and safe to race (one ``DELETE ... RETURNING`` decides who released). Records a
    ``reservation.released`` event (detail = ``reason``, payload = the freed cpus/bytes). Does not
    change the agent's state.
    """
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(
                "DELETE FROM scalers_reservation r USING agents_agent a WHERE r.agent_id = a.id AND a.agent_id = %s "
                "RETURNING r.cpus, r.memory_bytes, a.id",
                [agent_id],
            )
            row = cur.fetchone()
        if row is None:
            return False
        agent = Agent.objects.select_related("scaler").get(pk=row[2])
        record_event(
            agent,
            EventType.RELEASED,
            detail=reason,
            payload={"reason": reason, "cpus": row[0], "memoryBytes": row[1]},
        )
    return True


def teardown_agent(
    agent: Agent,
    reason: str,
    *,
    final_state: str = AgentState.DESTROYED,
    failure_reason: str = "",
    destroy_reason: str = "shutdown",
) -> bool:
    """Remove an agent's sandbox, then mark it ``final_state`` and release its reservation.

    Steps: move an active agent to ``destroying`` (compare-and-swap; a spawning agent's rq job
    sees its row leave ``spawning`` and aborts); ``get_backend(scaler).destroy(agent,
    destroy_reason)``; then in one transaction set ``final_state`` (``destroyed`` or ``failed``),
    ``finished_at`` and ``failure_reason`` and :func:`release`. ``destroy_reason`` is the
    event backend's scale-down reason (``idle``, ``drain``, ``spawn-timeout``, ``shutdown``...).

    Returns True when the reservation was released by this call. When ``destroy`` raises (or no
    backend can be loaded for an agent that has a sandbox), the agent stays ``destroying`` with
    its reservation and False is returned: the sweeper retries.
    """
    now = timezone.now()
    if agent.state in ACTIVE_STATES and agent.state != AgentState.DESTROYING:
        Agent.objects.filter(pk=agent.pk, state__in=ACTIVE_STATES).update(state=AgentState.DESTROYING, updated_at=now)
        agent.state = AgentState.DESTROYING
    if agent.state == AgentState.DESTROYING:
        try:
            backend = get_backend(agent.scaler)
        except ValueError as exc:
            if agent.managed_id or agent.scaler.type not in LOCAL_SCALER_TYPES:
                log.warning("cannot load the backend to destroy %s (%s); keeping its reservation", agent.agent_id, exc)
                return False
            backend = None  # nothing was created: nothing to remove
        if backend is not None:
            try:
                backend.destroy(agent, destroy_reason)
            except Exception as exc:  # noqa: BLE001 - keep the reservation, retry later
                log.warning("destroying %s failed (%s); reservation kept until it succeeds", agent.agent_id, exc)
                fields = {"updated_at": timezone.now()}
                if failure_reason and not agent.failure_reason:
                    fields["failure_reason"] = failure_reason[:4000]
                Agent.objects.filter(pk=agent.pk).update(**fields)
                return False
    with transaction.atomic():
        fields = {"state": final_state, "finished_at": timezone.now(), "updated_at": timezone.now()}
        if failure_reason:
            fields["failure_reason"] = failure_reason[:4000]
        Agent.objects.filter(pk=agent.pk, state__in=ACTIVE_STATES).update(**fields)
        released = release(agent.agent_id, reason)
    return released


def fail_spawn(
    agent: Agent,
    error: BaseException | str,
    *,
    reason: str = "spawn-failed",
    destroy_reason: str = "spawn-timeout",
    captured: list[str] | None = None,
    cleaned_up: bool = False,
) -> bool:
    """Fail a spawn: record ``scaler.failed``, mark the agent failed, release its reservation.

    ``error``: the exception the spawn raised, or a detail string; ``captured``: the agent's last
    output lines for the detail (an exception's own ``captured_output`` when not given).

    ``cleaned_up=False`` (the sweeps, the rq failure callback, the registration deadline, a spawn
    that could not be enqueued): a ``scaler.failed`` event unless one was already recorded for
    the agent, then :func:`teardown_agent` with ``final_state=failed``, which removes the sandbox
    first and keeps the reservation when that fails (the sweeper retries).

    ``cleaned_up=True`` (the spawn job, once the backend's failure path removed what the spawn
    created): a compare-and-swap to ``failed`` from any state in
    ``scalers.backends.failure.SPAWN_FAILURE_ENDS`` (an agent that registered or was drained while
    its spawn was still finishing ends ``failed`` too, instead of staying active with no
    sandbox), the event with the failed ``stage`` unless the backend reported its own failure
    (``event_recorded``), its tokens revoked, and the release. The event and the release happen
    even when someone else already moved the agent, so a spawn given up on still reports why.

    Returns True when the reservation was released by this call.
    """
    if isinstance(error, BaseException):
        captured = list(captured or getattr(error, "captured_output", None) or [])
    detail = failure_detail(error if isinstance(error, BaseException) else RuntimeError(error), captured or [])
    if not cleaned_up:
        if not ScalerEvent.objects.filter(agent=agent, type=EventType.FAILED).exists():
            record_event(agent, EventType.FAILED, detail=detail)
        return teardown_agent(
            agent, reason, final_state=AgentState.FAILED, failure_reason=detail, destroy_reason=destroy_reason
        )
    with transaction.atomic():
        mark_spawn_failed(agent.pk, detail, timezone.now())
        if not getattr(error, "event_recorded", False):
            record_event(
                agent, EventType.FAILED, detail, payload={"stage": getattr(error, "stage", ""), "reason": reason}
            )
    try:
        revoke_agent_tokens(agent)
    except Exception:  # noqa: BLE001
        log.warning("could not revoke tokens of %s", agent.agent_id, exc_info=True)
    return release(agent.agent_id, reason)


def _agent_from_job(job) -> Agent | None:
    ref = (getattr(job, "meta", None) or {}).get("agent_id")
    args = list(getattr(job, "args", None) or [])
    kwargs = dict(getattr(job, "kwargs", None) or {})
    if ref is None:
        ref = kwargs.get("agent_pk", kwargs.get("agent_id", args[0] if args else None))
    if ref is None:
        return None
    qs = Agent.objects.select_related("scaler")
    if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
        return qs.filter(pk=int(ref)).first()
    return qs.filter(agent_id=str(ref)).first()


def on_spawn_job_failure(job, connection_=None, exc_type=None, exc_value=None, tb=None, *args) -> None:
    """rq ``on_failure`` callback of the spawn job: fail the agent and release its reservation.

    rq calls it when the job raises, when it exceeds its timeout, and (rq >= 2) when a killed
    worker's job is found abandoned (``AbandonedJobError``). The agent is found from
    ``job.meta["agent_id"]``, else the first positional argument (``spawn_agent(agent_pk)``).
    An agent that already registered is left alone (the spawn did its job). Idempotent.
    """
    agent = _agent_from_job(job)
    if agent is None:
        log.warning("spawn job %s failed but names no known agent", getattr(job, "id", "?"))
        return
    if agent.state not in ACTIVE_STATES or agent.registered_at is not None:
        release_if_terminal(agent)
        return
    name = getattr(exc_type, "__name__", None) or type(exc_value).__name__
    detail = f"spawn job {getattr(job, 'id', '')} failed: {name}: {exc_value}".strip()
    fail_spawn(agent, detail, reason="spawn-job-failed")


def release_if_terminal(agent: Agent) -> bool:
    """Release the reservation of an agent already ``failed``/``destroyed`` (a no-op otherwise)."""
    if agent.state in (AgentState.FAILED, AgentState.DESTROYED):
        return release(agent.agent_id, f"agent {agent.state}")
    return False


def stale_window_seconds() -> int:
    """``max(spawn timeout, 300 s)``."""
    return max(int(settings.KICI_SPAWN_TIMEOUT_SECONDS), MIN_STALE_WINDOW_SECONDS)


def prune_stale_spawns(now=None) -> int:
    """Fail and release spawns running longer than :func:`stale_window_seconds`.

    The clock starts at ``spawn_started_at`` (set when the rq job actually began); spawns still
    queued (``spawn_started_at`` null) are never pruned here. Returns how many were pruned.
    """
    now = now or timezone.now()
    window = stale_window_seconds()
    cutoff = now - timedelta(seconds=window)
    n = 0
    for agent in Agent.objects.select_related("scaler").filter(state=AgentState.SPAWNING, spawn_started_at__lt=cutoff):
        fail_spawn(agent, f"spawn did not finish within {window}s (stale prune)", reason="stale-prune")
        n += 1
    return n


def token_ttl_seconds(agent: Agent) -> int:
    """How long an agent may take to register: the token TTL. Event scalers mint at
    claim time, so their window is ``claimTtlSeconds`` + ``agentTokenTtlSeconds`` (300 + 600)."""
    if agent.scaler.type == ScalerType.EVENT:
        cfg = agent.scaler.config or {}
        return int(cfg.get("claimTtlSeconds") or 300) + int(cfg.get("agentTokenTtlSeconds") or 600)
    return int(settings.KICI_AGENT_TOKEN_TTL_SECONDS)


def expire_unregistered_agents(now=None) -> int:
    """Fail and release agents that never registered within their token TTL.

    An agent is expired when it is spawning or running, has no ``registered_at``, and either was
    created longer than :func:`token_ttl_seconds` ago, or all its tokens expired unused.
    Returns how many were expired.
    """
    now = now or timezone.now()
    n = 0
    qs = (
        Agent.objects.select_related("scaler")
        .filter(state__in=[AgentState.SPAWNING, AgentState.RUNNING], registered_at__isnull=True)
        .annotate(token_expiry=Max("tokens__expires_at"), tokens_used=Count("tokens__used_at"))
    )
    for agent in qs:
        ttl = token_ttl_seconds(agent)
        too_old = agent.created_at < now - timedelta(seconds=ttl)
        tokens_dead = agent.token_expiry is not None and agent.tokens_used == 0 and agent.token_expiry < now
        if too_old or tokens_dead:
            fail_spawn(agent, f"agent did not register within its token TTL ({ttl}s)", reason="token-expired")
            n += 1
    return n


def reap_failed_spawn_jobs(min_age_seconds: float = 10.0, now=None) -> int:
    """Fail spawning agents whose rq job rq reports failed, stopped or canceled.

    A backstop for :func:`on_spawn_job_failure` (e.g. a worker killed before rq's abandoned-job
    cleanup ran). Agents without ``rq_job_id`` or whose job is unknown to rq are left to the
    token-TTL expiry. Returns how many were failed.
    """
    now = now or timezone.now()
    agents = list(
        Agent.objects.select_related("scaler")
        .filter(state=AgentState.SPAWNING, created_at__lt=now - timedelta(seconds=min_age_seconds))
        .exclude(rq_job_id="")
    )
    if not agents:
        return 0
    try:
        jobs = Job.fetch_many([a.rq_job_id for a in agents], connection=django_rq.get_connection("default"))
    except Exception as exc:  # noqa: BLE001 - Redis down: try again next sweep
        log.warning("cannot read rq job states: %s", exc)
        return 0
    n = 0
    for agent, job in zip(agents, jobs, strict=True):
        if job is None:
            continue
        status = job.get_status(refresh=False)
        if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            fail_spawn(agent, f"spawn job {job.id} is {status}", reason="spawn-job-failed")
            n += 1
    return n


def retry_stuck_teardowns(min_age_seconds: float = 30.0, now=None) -> int:
    """Retry :func:`teardown_agent` for agents left ``destroying`` (their destroy failed).
    Returns how many were released."""
    now = now or timezone.now()
    n = 0
    for agent in Agent.objects.select_related("scaler").filter(
        state=AgentState.DESTROYING, updated_at__lt=now - timedelta(seconds=min_age_seconds)
    ):
        final = AgentState.FAILED if agent.failure_reason else AgentState.DESTROYED
        if teardown_agent(agent, "teardown-retry", final_state=final):
            n += 1
    return n
