"""The one owner of an agent's transitions after admission: spawn failures, teardown, drain,
job completion, release by the orchestrator, recovery's and the sweeper's ends. Why a reservation
outlives a failed destroy, and every end with its reason: docs/lifecycle.md ("Ends")."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import django_rq
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone
from rq.job import Job, JobStatus

from agents.choices import ACTIVE_STATES, TERMINAL_STATES, UNREGISTERED_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent, ScalerEvent
from agents.tokens import revoke_agent_tokens, revoke_registration_tokens
from lib.wording import json_text
from scalers.admission.ledger import release
from scalers.backends.factory import get_backend
from scalers.backends.failure import failure_detail, mark_spawn_failed
from scalers.choices import LOCAL_SCALER_TYPES, ScalerType
from scalers.holds import hold_to_take, take_hold
from scalers.hosts import scaler_queue
from scalers.models import Reservation, Scaler, ScalerTeardown, this_host

log = logging.getLogger(__name__)

#: Seconds a cleanup rq job (teardown, reclaim) may run.
CLEANUP_JOB_TIMEOUT_SECONDS = 150


#: Minimum stale-prune window in seconds: the window is ``max(spawnTimeout, 300 s)``.
MIN_STALE_WINDOW_SECONDS = 300


def teardown_agent(
    agent: Agent,
    reason: str,
    *,
    final_state: str = AgentState.DESTROYED,
    failure_reason: str = "",
    destroy_reason: str = "shutdown",
    hold: bool = True,
) -> bool:
    """Remove an agent's sandbox, then mark it ``final_state`` and release its reservation (the steps:
    docs/lifecycle.md, "Teardown"). ``destroy_reason``: the event backend's scale-down reason
    (``idle``, ``drain``, ``spawn-timeout``, ``shutdown``...). ``hold=False`` (an explicit destroy, a
    retried teardown, the end of a hold) ends even an agent a hold would keep. Returns True when this
    call released the reservation; False when the agent was held, or when ``destroy`` raised (or no
    backend loads for a sandbox) and it stays ``destroying`` with its reservation for the sweeper.
    """
    if hold:
        taken = hold_to_take(agent, failed=final_state == AgentState.FAILED)
        if taken is not None and take_hold(
            agent, taken, end_state=final_state, reason=reason, failure_reason=failure_reason
        ):
            return False
    now = timezone.now()
    if agent.state in ACTIVE_STATES and agent.state != AgentState.DESTROYING:
        Agent.objects.filter(pk=agent.pk, state__in=ACTIVE_STATES).update(
            state=AgentState.DESTROYING, updated_at=now, teardown_reason=reason[:200]
        )
        agent.state, agent.teardown_reason = AgentState.DESTROYING, reason[:200]
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
                fields: dict[str, object] = {"updated_at": timezone.now()}
                if failure_reason and not agent.failure_reason:
                    fields["failure_reason"] = failure_reason[:4000]
                Agent.objects.filter(pk=agent.pk).update(**fields)
                return False
    with transaction.atomic():
        fields = {"state": final_state, "finished_at": timezone.now(), "updated_at": timezone.now()}
        if failure_reason:
            fields["failure_reason"] = failure_reason[:4000]
        ended = Agent.objects.filter(pk=agent.pk, state__in=ACTIVE_STATES).update(**fields)
        if ended:
            revoke_registration_tokens(agent)
        if ended and final_state == AgentState.DESTROYED:
            record_event(agent, EventType.DESTROYED, f"sandbox removed ({reason})", payload={"reason": reason})
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
    payload: dict | None = None,
) -> bool:
    """Fail a spawn: record ``scaler.failed``, mark the agent failed, release its reservation. ``error``:
    the exception the spawn raised, or a detail; ``captured``: the agent's last output lines (default:
    the exception's ``captured_output``); ``payload``: extra event fields (a boot's ``failureType``);
    ``cleaned_up``: the backend's failure path already removed what the spawn created, else
    :func:`teardown_agent` removes it (the two ways: docs/lifecycle.md, "Teardown"). Returns True when
    this call released the reservation.
    """
    if isinstance(error, BaseException):
        captured = list(captured or getattr(error, "captured_output", None) or [])
    detail = failure_detail(error if isinstance(error, BaseException) else RuntimeError(error), captured or [])
    if not cleaned_up:
        if not ScalerEvent.objects.filter(agent=agent, type=EventType.FAILED).exists():
            record_event(agent, EventType.FAILED, detail=detail, payload=payload)
        return teardown_agent(
            agent, reason, final_state=AgentState.FAILED, failure_reason=detail, destroy_reason=destroy_reason
        )
    with transaction.atomic():
        mark_spawn_failed(agent.pk, detail, timezone.now())
        if not getattr(error, "event_recorded", False):
            record_event(
                agent,
                EventType.FAILED,
                detail,
                payload={"stage": getattr(error, "stage", ""), "reason": reason, **(payload or {})},
            )
    try:
        revoke_agent_tokens(agent)
    except Exception:
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


def awaits_the_reaper(agent: Agent) -> bool:
    """An event-scaler provision whose scale-up was delivered (``backend_context.requestId``): its
    wait for registration is ended by the event-provision reaper (``scalers.provision_reaper``,
    after the flap grace), not by the registration deadline (:func:`expire_registration`) or the
    stale prune. True in any state: the reaper judges it ``spawning`` (its spawn job stored the
    delivery and died before the move to ``connecting``), ``connecting``, ``running``, ``draining``."""
    return agent.scaler.type == ScalerType.EVENT and bool((agent.backend_context or {}).get("requestId"))


def stale_window_seconds() -> int:
    """``max(spawn timeout, 300 s)``."""
    return max(int(settings.KICI_SPAWN_TIMEOUT_SECONDS), MIN_STALE_WINDOW_SECONDS)


def spawn_timeout_seconds() -> int:
    """The spawn deadline in seconds (``settings.KICI_SPAWN_TIMEOUT_SECONDS``), counted from
    ``spawn_started_at``: it bounds the backend call and the registration wait together."""
    return int(settings.KICI_SPAWN_TIMEOUT_SECONDS)


def registration_deadline(agent: Agent) -> datetime:
    """When an agent that has not registered is given up: ``spawn_started_at`` (now when unset)
    + :func:`spawn_timeout_seconds`."""
    return (agent.spawn_started_at or timezone.now()) + timedelta(seconds=spawn_timeout_seconds())


def fail_connecting(
    agent: Agent,
    error: BaseException | str,
    *,
    reason: str,
    destroy_reason: str,
    captured: list[str] | None = None,
    payload: dict | None = None,
) -> bool:
    """Give up on a ``connecting`` agent (its backend call is done, it has not registered).

    Compare-and-swap ``connecting`` → ``destroying`` first (an agent that registered or was ended
    meanwhile is left alone: False), revoke its tokens (a late registration must not revive it),
    then :func:`fail_spawn`: ``scaler.failed`` with ``error`` + ``captured`` and ``payload``,
    destroy through the backend, mark failed, release (a destroy that fails keeps the reservation
    for :func:`retry_stuck_teardowns`). Returns True when this call moved the agent.
    """
    won = Agent.objects.filter(pk=agent.pk, state=AgentState.CONNECTING).update(
        state=AgentState.DESTROYING, updated_at=timezone.now()
    )
    if not won:
        return False
    agent.state = AgentState.DESTROYING
    try:
        revoke_agent_tokens(agent)
    except Exception:  # the row is destroying: a registration is refused anyway
        log.warning("could not revoke tokens of %s", agent.agent_id, exc_info=True)
    fail_spawn(agent, error, reason=reason, destroy_reason=destroy_reason, captured=captured, payload=payload)
    return True


def expire_registration(agent_pk: int, *, now: datetime | None = None) -> bool:
    """Give up on a ``connecting`` agent past its :func:`registration_deadline`.

    Captures its output (the backend's ``captured_output_for``, when it has one), then
    :func:`fail_connecting` with "agent did not register within N s" (``spawn-timeout``). Returns
    True when it expired the agent, False when it registered, was already handled, is not due, or
    is an event provision the reaper ends (:func:`awaits_the_reaper`).
    """
    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state != AgentState.CONNECTING or awaits_the_reaper(agent):
        return False
    if (now or timezone.now()) < registration_deadline(agent):
        return False
    captured: list[str] = []
    try:
        capture = getattr(get_backend(agent.scaler), "captured_output_for", None)
        if capture:
            captured = capture(agent)
    except Exception:  # the output is a courtesy
        log.warning("could not capture the output of %s", agent.agent_id, exc_info=True)
    error = RuntimeError(f"agent did not register within {spawn_timeout_seconds()} s")
    return fail_connecting(agent, error, captured=captured, reason="spawn-timeout", destroy_reason="spawn-timeout")


def prune_stale_spawns(now=None) -> int:
    """The sweeper's end of this host's spawns past their time: ``connecting`` agents past their
    :func:`registration_deadline` (:func:`expire_registration`) and ``spawning`` agents whose backend
    call outlived :func:`stale_window_seconds` (``stale-prune``). Returns how many were failed. What
    each catches, and what it leaves alone: docs/lifecycle.md ("The sweeper's spawn backstops").
    """
    now = now or timezone.now()
    overdue = Agent.objects.filter(
        scaler__host=this_host(),
        state=AgentState.CONNECTING,
        spawn_started_at__lte=now - timedelta(seconds=spawn_timeout_seconds()),
    ).values_list("pk", flat=True)
    n = sum(1 for pk in list(overdue) if expire_registration(pk, now=now))
    window = stale_window_seconds()
    cutoff = now - timedelta(seconds=window)
    for agent in Agent.objects.select_related("scaler").filter(
        scaler__host=this_host(), state=AgentState.SPAWNING, spawn_started_at__lt=cutoff
    ):
        if awaits_the_reaper(agent):
            continue
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
    """Fail and release agents of this host's scalers that never registered within their token TTL.

    An agent is expired when it is spawning or running, has no ``registered_at``, and either was
    created longer than :func:`token_ttl_seconds` ago, or all its tokens expired unused.
    Returns how many were expired.
    """
    now = now or timezone.now()
    n = 0
    qs = (
        Agent.objects.select_related("scaler")
        .filter(
            scaler__host=this_host(),
            state__in=[*UNREGISTERED_STATES, AgentState.RUNNING],
            registered_at__isnull=True,
        )
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
    """Fail this host's spawning agents whose rq job failed, stopped or was canceled
    (``spawn-job-failed``) or is no longer in Redis (``spawn-job-lost``), once their job id is
    ``min_age_seconds`` old. Returns how many were failed; Redis unreachable: none (next sweep). Why
    each case, and what it leaves alone: docs/lifecycle.md ("The sweeper's spawn backstops").
    """
    now = now or timezone.now()
    agents = list(
        Agent.objects.select_related("scaler")
        .filter(
            scaler__host=this_host(),
            state=AgentState.SPAWNING,
            updated_at__lt=now - timedelta(seconds=min_age_seconds),
        )
        .exclude(rq_job_id="")
    )
    if not agents:
        return 0
    try:
        jobs = Job.fetch_many(
            [a.rq_job_id for a in agents],
            connection=django_rq.get_connection("default"),
            serializer=settings.KICI_JOB_SERIALIZER,
        )
    except Exception as exc:  # noqa: BLE001 - Redis down: try again next sweep
        log.warning("cannot read rq job states: %s", exc)
        return 0
    n = 0
    for agent, job in zip(agents, jobs, strict=True):
        if awaits_the_reaper(agent):
            continue
        if job is None:
            fail_spawn(
                agent,
                f"its spawn job {agent.rq_job_id} is gone from Redis (restarted, flushed or evicted): "
                "nothing will run the spawn",
                reason="spawn-job-lost",
            )
            n += 1
            continue
        status = job.get_status(refresh=False)
        if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            cause = _job_failure_cause(job)
            detail = f"spawn job {job.id} is {status.value}" + (f": {cause}" if cause else "")
            fail_spawn(agent, detail, reason="spawn-job-failed")
            n += 1
    return n


def _job_failure_cause(job: Job) -> str:
    """The last line of the exception rq recorded for ``job`` (``RuntimeError: backend
    exploded``), or "" when it kept none; the worker's log is not where a person looks first."""
    try:
        result = job.latest_result()
    except Exception:  # noqa: BLE001 - the cause is a courtesy: the failure stands without it
        return ""
    text = (getattr(result, "exc_string", None) or "").strip() if result is not None else ""
    return text.splitlines()[-1][:500] if text else ""


#: Seconds an agent stays ``destroying`` before the sweeper retries its teardown (its destroy
#: failed, or the worker running it was killed).
STUCK_TEARDOWN_SECONDS = 30.0


def retry_stuck_teardowns(min_age_seconds: float = STUCK_TEARDOWN_SECONDS, now=None) -> int:
    """Retry :func:`teardown_agent` for agents of this host's scalers left ``destroying`` longer
    than ``min_age_seconds`` (their destroy failed, or the worker running it died). Returns how
    many were released."""
    now = now or timezone.now()
    n = 0
    for agent in Agent.objects.select_related("scaler").filter(
        scaler__host=this_host(), state=AgentState.DESTROYING, updated_at__lt=now - timedelta(seconds=min_age_seconds)
    ):
        final = AgentState.FAILED if agent.failure_reason else AgentState.DESTROYED
        # The cause stays the reason (job-complete, release, drain...): the retry is only how it ended.
        reason = f"{agent.teardown_reason} (teardown retried)" if agent.teardown_reason else "teardown-retry"
        if teardown_agent(agent, reason, final_state=final, hold=False):
            n += 1
    return n


# --- drain ---------------------------------------------------------------------------------------


def mark_draining(agent_id: str, *, unbound_only: bool = False) -> int | None:
    """Flag a running agent ``draining`` and return its active-job count.

    Returns ``None`` when the agent is unknown or not running/draining (not registered, or
    already on its way out), and with ``unbound_only`` when it is bound to a job: that check is
    part of the compare-and-swap, so a warm agent bound to a job (``ledger.bind_warm_agent``, the
    same row's other compare-and-swap) is never drained from under it. Records ``agent.draining``
    on the transition.
    """
    unbound = " AND bound_job_id = ''" if unbound_only else ""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "UPDATE agents_agent SET state = %s, updated_at = now() WHERE agent_id = %s AND state = %s"
            + unbound
            + " RETURNING id, active_jobs",
            [str(AgentState.DRAINING), agent_id, str(AgentState.RUNNING)],
        )
        row = cur.fetchone()
        if row is not None:
            agent = Agent.objects.select_related("scaler").get(pk=row[0])
            record_event(
                agent,
                EventType.DRAINING,
                detail="draining: no new job; torn down once no job is active",
                payload={"activeJobs": row[1]},
            )
            return row[1]
        cur.execute(
            "SELECT active_jobs FROM agents_agent WHERE agent_id = %s AND state = %s",
            [agent_id, str(AgentState.DRAINING)],
        )
        row = cur.fetchone()
        return row[0] if row else None


def clear_draining(agent_id: str) -> None:
    """Undo :func:`mark_draining` when the teardown did not happen (draining ⇒ running)."""
    Agent.objects.filter(agent_id=agent_id, state=AgentState.DRAINING).update(
        state=AgentState.RUNNING, updated_at=timezone.now()
    )


def drain_and_destroy(agent: Agent, reason: str, *, destroy_reason: str = "drain") -> bool:
    """Destroy an idle agent the safe way (warm-pool idle destroys, retiring scalers).

    :func:`mark_draining` of an unbound agent; if it has active jobs, :func:`clear_draining` and
    keep it (False); if it is not running or was bound to a job meanwhile, do nothing (False);
    otherwise :func:`teardown_agent` (True when its reservation was released).
    """
    active = mark_draining(agent.agent_id, unbound_only=True)
    if active is None:
        return False
    if active > 0:
        clear_draining(agent.agent_id)
        return False
    agent.state = AgentState.DRAINING
    return teardown_agent(agent, reason, destroy_reason=destroy_reason)


def retirement_sweep() -> bool:
    """Drain and tear down this host's retiring scalers. Returns True when it did anything.

    For every retiring scaler of this host not yet torn down: idle agents (running, unbound, no active jobs)
    are drained and destroyed; agents working on a job are left to finish. Once the scaler
    holds no active agent and no reservation it is torn down: the backend's optional
    ``teardown()`` runs and a :class:`ScalerTeardown` row is written. A scaler the config
    brought back (no longer retiring) loses its teardown row.
    """
    did = False
    ScalerTeardown.objects.filter(scaler__retiring=False, scaler__host=this_host()).delete()
    for scaler in Scaler.objects.on_this_host().filter(retiring=True, teardown__isnull=True):
        idle = Agent.objects.select_related("scaler").filter(
            scaler=scaler, state=AgentState.RUNNING, bound_job_id="", active_jobs=0
        )
        for agent in idle:
            if drain_and_destroy(agent, "scaler-retired", destroy_reason="drain"):
                did = True
        if Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES).exists():
            continue
        if Reservation.objects.filter(scaler=scaler).exists():
            continue
        detail = ""
        try:
            backend = get_backend(scaler)
            hook = getattr(backend, "teardown", None)
            if callable(hook):
                hook()
                detail = "backend teardown ran"
        except Exception as exc:  # noqa: BLE001 - recorded; the scaler is empty either way
            detail = f"backend teardown failed: {exc}"
            log.warning("retiring scaler %s: %s", scaler.name, detail)
        ScalerTeardown.objects.get_or_create(scaler=scaler, defaults={"detail": detail})
        log.info("retired scaler %s torn down (no agents, no reservations)", scaler.name)
        did = True
    return did


# --- the orchestrator's ends ----------------------------------------------------------------------


@dataclass
class Refused(Exception):
    """A lifecycle call that cannot be honoured: HTTP ``status``, error ``code``, ``message``, and
    the request's ``field`` at fault when one is (None when it is the agent's state)."""

    status: int
    code: str
    message: str
    field: str | None = None

    def __str__(self) -> str:
        return self.message


def _locked(agent_id: str) -> Agent:
    agent = Agent.objects.select_for_update().filter(agent_id=agent_id).first()
    if agent is None:
        raise Refused(404, "not-found", f"no agent {agent_id!r}")
    return agent


def _start_teardown(agent: Agent, reason: str) -> bool:
    """Move an active agent to ``destroying`` because of ``reason`` (compare-and-swap; kept as
    ``teardown_reason`` for a retry); False when it already ended."""
    won = Agent.objects.filter(pk=agent.pk, state__in=ACTIVE_STATES).update(
        state=AgentState.DESTROYING, updated_at=timezone.now(), teardown_reason=reason[:200]
    )
    if won:
        agent.state, agent.teardown_reason = AgentState.DESTROYING, reason[:200]
    return bool(won)


def _record_call(agent: Agent, call: str, caller: str, **payload) -> None:
    """An ``api.call`` event: the orchestrator's ``call`` on ``agent`` by API token ``caller``."""
    if caller:
        record_event(
            agent, EventType.API_CALL, f"{call} by token {caller}", payload={"call": call, "token": caller} | payload
        )


def complete_job(agent_id: str, job_id: str, *, caller: str = "", failed: bool = False) -> Agent:
    """Record that ``job_id`` finished on ``agent_id`` and end or recycle the agent. ``caller``: the API
    token's name, recorded as an ``api.call`` event (none when ""); ``failed``: the orchestrator
    reported ``result: failure``, so a label set with ``debugHold.onFailure`` holds the agent (as an
    armed hold does for any end). Idempotent: a repeat answers the agent as it now is. Raises
    :class:`Refused` 404 for an unknown agent, 409 ``job-mismatch`` when it is not bound to ``job_id``.
    """
    with transaction.atomic():
        agent = _locked(agent_id)
        if agent.completed_job_id == job_id:
            _record_call(agent, "job-complete", caller, jobId=job_id, repeat=True)
            return agent
        if agent.bound_job_id != job_id:
            bound = json_text(agent.bound_job_id) if agent.bound_job_id else "no job"
            raise Refused(
                409, "job-mismatch", f"agent {agent_id} is bound to {bound}, not {json_text(job_id)}", field="jobId"
            )
        _record_call(agent, "job-complete", caller, jobId=job_id, **({"result": "failure"} if failed else {}))
        agent.completed_job_id = job_id
        agent.jobs_served += 1
        fields = {
            "completed_job_id": job_id,
            "active_jobs": 0,
            "jobs_served": agent.jobs_served,
            "updated_at": timezone.now(),
        }
        held = hold_to_take(agent, failed=failed) if agent.state not in TERMINAL_STATES else None
        recycle = (
            held is None
            and agent.warm
            and agent.state == AgentState.RUNNING
            and not agent.scaler.retiring
            and agent.label_set is not None
            and agent.jobs_served < agent.label_set.max_uses
        )
        if recycle:
            fields.update(bound_job_id="", run_id="", idempotency_key="", scale_body=None)
            agent.bound_job_id = agent.run_id = agent.idempotency_key = ""
            agent.scale_body = None
        Agent.objects.filter(pk=agent.pk).update(**fields)
        if agent.state in TERMINAL_STATES or recycle:
            return agent
        why = "job-complete (the job failed)" if failed else "job-complete"
        if held is not None and take_hold(agent, held, end_state=AgentState.DESTROYED, reason=why):
            return agent
        if _start_teardown(agent, "job-complete"):
            transaction.on_commit(lambda: enqueue_teardown(agent, "job-complete", destroy_reason="job-complete"))
    return agent


def release_agent(agent_id: str, reason: str, *, caller: str = "") -> Agent:
    """Tear ``agent_id`` down because the orchestrator gave it up (``reason``: its words, kept in
    the release event). ``caller``: the API token's name, recorded as an ``api.call`` event (none
    when ""). Idempotent; raises :class:`Refused` 404 for an unknown agent."""
    with transaction.atomic():
        agent = _locked(agent_id)
        _record_call(agent, "release", caller, reason=reason)
        if agent.state in TERMINAL_STATES:
            return agent
        why = f"released by the orchestrator: {reason}" if reason else "released by the orchestrator"
        held = hold_to_take(agent, failed=False)
        if held is not None and take_hold(agent, held, end_state=AgentState.DESTROYED, reason=why):
            return agent
        if _start_teardown(agent, why):
            transaction.on_commit(lambda: enqueue_teardown(agent, why, destroy_reason="released"))
    return agent


def drain_idle_agents() -> int:
    """Tear down every ``draining`` agent of this host's scalers whose last heartbeat reported no
    active job. Returns how many reservations were released.

    Each agent is taken with a compare-and-swap (still draining, still no active job), so an agent
    that reported a job in the meantime, or that another sweep took, is left alone.
    """
    released = 0
    for agent in Agent.objects.select_related("scaler").filter(
        scaler__host=this_host(), state=AgentState.DRAINING, active_jobs=0
    ):
        won = Agent.objects.filter(pk=agent.pk, state=AgentState.DRAINING, active_jobs=0).update(
            state=AgentState.DESTROYING, updated_at=timezone.now(), teardown_reason="drained"
        )
        if not won:
            continue
        agent.state = AgentState.DESTROYING
        if teardown_agent(agent, "drained", destroy_reason="drain"):
            released += 1
    return released


# --- the end of a debug hold ----------------------------------------------------------------------


def _end_hold(agent: Agent, why: str) -> bool:
    """Tear down held ``agent`` with the end its hold spared (compare-and-swap ``held`` →
    ``destroying``, so of two ends racing only one acts): ``why`` plus the spared reason is the
    teardown's reason, the spared state (``failed`` keeps its failure reason) its final state.
    Returns False when it was no longer held; True once the teardown ran (a destroy that failed
    leaves it ``destroying`` with its reservation, for :func:`retry_stuck_teardowns`)."""
    hold = agent.hold or {}
    reason = f"{why} ({hold['endReason']})" if hold.get("endReason") else why
    won = Agent.objects.filter(pk=agent.pk, state=AgentState.HELD).update(
        state=AgentState.DESTROYING, updated_at=timezone.now(), teardown_reason=reason[:200]
    )
    if not won:
        return False
    agent.state = AgentState.DESTROYING
    final = AgentState.FAILED if hold.get("end") == AgentState.FAILED else AgentState.DESTROYED
    teardown_agent(
        agent, reason, final_state=final, failure_reason=agent.failure_reason, destroy_reason="shutdown", hold=False
    )
    return True


def reap_expired_holds(now: datetime | None = None) -> int:
    """Tear down the held agents of this host's scalers whose ``held_until`` passed (the sweeper,
    every round). Returns how many were ended."""
    now = now or timezone.now()
    due = Agent.objects.select_related("scaler").filter(
        scaler__host=this_host(), state=AgentState.HELD, held_until__lte=now
    )
    return sum(1 for agent in due if _end_hold(agent, "hold expired"))


def release_hold(agent_id: str, by: str) -> bool:
    """End the hold of ``agent_id`` before it expires (an approved ``hold-release`` operation):
    its sandbox is torn down now. ``by`` names who asked. False when it is not held."""
    agent = Agent.objects.select_related("scaler").filter(agent_id=agent_id, state=AgentState.HELD).first()
    return agent is not None and _end_hold(agent, f"hold released by {by}")


# --- cleanup jobs on the scaler's host queue ------------------------------------------------------------


def teardown_job_id(agent: Agent) -> str:
    return f"teardown-{agent.agent_id}"


def enqueue_teardown(agent: Agent, reason: str, *, destroy_reason: str) -> None:
    """Queue :func:`teardown_job` for ``agent`` (already ``destroying``) on its scaler's host queue.

    A failure to enqueue is logged, not raised: the agent stays ``destroying`` with its
    reservation and the sweeper's ``retry_stuck_teardowns`` ends it.
    """
    _enqueue_cleanup(
        agent,
        teardown_job,
        (agent.pk, reason, destroy_reason),
        job_id=teardown_job_id(agent),
        description=f"tear down {agent.agent_id} ({reason})",
        fallback="the sweeper retries it",
    )


def _enqueue_cleanup(agent: Agent, func, args: tuple, *, job_id: str, description: str, fallback: str) -> None:
    """Queue a cleanup job of ``agent`` on its scaler's host queue (``scalers.hosts``); a failure to
    enqueue is logged with what will end the work instead (``fallback``), never raised."""
    try:
        scaler_queue(agent.scaler).enqueue(
            func,
            *args,
            job_id=job_id,
            job_timeout=CLEANUP_JOB_TIMEOUT_SECONDS,
            result_ttl=3600,
            failure_ttl=24 * 3600,
            description=description,
        )
    except Exception as exc:  # noqa: BLE001 - the fallback ends it
        log.warning("could not queue %r (%s); %s", description, exc, fallback)


def teardown_job(agent_pk: int, reason: str, destroy_reason: str) -> bool:
    """rq job: :func:`~scalers.lifecycle.teardown_agent` with ``final_state`` destroyed.
    Returns whether the reservation was released (False: the destroy failed, the sweeper retries)."""
    agent = Agent.objects.select_related("scaler").filter(pk=agent_pk).first()
    if agent is None or agent.state in TERMINAL_STATES:
        return False
    return teardown_agent(agent, reason, destroy_reason=destroy_reason)


def enqueue_reclaim(agent: Agent) -> None:
    """Queue :func:`reclaim_job` for an agent whose registration was refused; an enqueue failure is
    logged (the orphan-container sweep finds the sandbox later)."""
    _enqueue_cleanup(
        agent,
        reclaim_job,
        (agent.pk,),
        job_id=f"reclaim-{agent.agent_id}",
        description=f"reclaim the sandbox of {agent.agent_id} (refused registration)",
        fallback="the orphan-container sweep finds the sandbox",
    )


def reclaim_job(agent_pk: int) -> bool:
    """rq job: remove the sandbox of an agent that asked to register after it had ended.

    The sandbox runs (it is registering) but its agent row is ``destroyed`` or ``failed``, so no
    teardown will ever come for it. The row is read again here and nothing is touched unless it is
    still terminal (an active row belongs to a spawn or a teardown in progress). Returns whether the
    backend removed something; records an ``agent.destroyed`` event when it did.
    """
    agent = Agent.objects.select_related("scaler").filter(pk=agent_pk).first()
    if agent is None or agent.state not in TERMINAL_STATES:
        return False
    reclaimed = bool(get_backend(agent.scaler).reap_unowned(agent.agent_id))
    if reclaimed:
        record_event(agent, EventType.DESTROYED, "sandbox reclaimed: it asked to register after its agent had ended")
    return reclaimed
