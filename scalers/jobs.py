"""rq jobs that run spawns and teardowns on the host queue (``settings.KICI_HOST_QUEUE``).

- :func:`enqueue_spawn` (called by admission inside its transaction) enqueues
  :func:`spawn_agent` when the transaction commits, with job id ``spawn-<agent id>``.
- :func:`spawn_agent` runs the backend's spawn under the spawn deadline
  (``spawn_started_at + settings.KICI_SPAWN_TIMEOUT_SECONDS``) and cancellation (the agent row
  leaving ``spawning``), then schedules :func:`expire_spawn` at the deadline: the registration
  wait. On any failure: ``scaler.failed`` (with captured output), the agent marked failed, what
  was created removed, the reservation released (``scalers.admission.release``).
- The job timeout is the spawn timeout plus ``CLEANUP_GRACE_SECONDS``: the spawn itself gives
  up at the deadline and cleans up inside that grace; rq's hard kill and the failure callback
  :func:`spawn_job_failed` are the backstop for a job that hangs anyway.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import django_rq
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rq import Callback

from agents.choices import TERMINAL_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent

log = logging.getLogger(__name__)

#: Seconds the rq job may run past the spawn deadline to clean up after giving up.
CLEANUP_GRACE_SECONDS = 30


def spawn_timeout_seconds() -> int:
    """The spawn deadline in seconds (``settings.KICI_SPAWN_TIMEOUT_SECONDS``, SPEC c.1 step 9)."""
    return int(settings.KICI_SPAWN_TIMEOUT_SECONDS)


def spawn_job_id(agent: Agent) -> str:
    return f"spawn-{agent.agent_id}"


def host_queue():
    return django_rq.get_queue(settings.KICI_HOST_QUEUE)


def enqueue_spawn(agent: Agent) -> str:
    """Enqueue ``spawn_agent(agent.pk)`` on the host queue when the current transaction commits.

    Records the job id on the agent (``rq_job_id``) and returns it. Job timeout: spawn timeout +
    ``CLEANUP_GRACE_SECONDS``; on a hard failure rq calls :func:`spawn_job_failed`.
    """
    job_id = spawn_job_id(agent)
    Agent.objects.filter(pk=agent.pk).update(rq_job_id=job_id)
    agent.rq_job_id = job_id
    timeout = spawn_timeout_seconds() + CLEANUP_GRACE_SECONDS
    host_queue().enqueue(
        spawn_agent,
        agent.pk,
        job_id=job_id,
        job_timeout=timeout,
        result_ttl=3600,
        failure_ttl=24 * 3600,
        on_failure=Callback(spawn_job_failed),
        description=f"spawn {agent.agent_id}",
    )
    return job_id


def _cancel_reason(agent_pk: int) -> str | None:
    state = Agent.objects.filter(pk=agent_pk).values_list("state", flat=True).first()
    if state is None:
        return "the agent row is gone"
    if state in (AgentState.SPAWNING, AgentState.RUNNING):
        return None  # running: the agent registered before the spawn finished its last steps
    return f"the agent is {state}"


def _deadline(agent: Agent) -> float:
    started = agent.spawn_started_at or timezone.now()
    return started.timestamp() + spawn_timeout_seconds()


def release_reservation(agent: Agent, reason: str) -> None:
    """Release the agent's reservation through admission (``scalers.admission.release``, idempotent)."""
    try:
        from scalers.admission.release import release
    except ImportError:  # admission not installed in this build: drop the row ourselves
        from scalers.models import Reservation

        if Reservation.objects.filter(agent=agent).delete()[0]:
            record_event(agent, EventType.RELEASED, reason)
        return
    release(agent.agent_id, reason)


def fail_spawn(
    agent: Agent, error: BaseException | str, *, captured: list[str] | None = None, reason: str = "spawn-failed"
) -> None:
    """Record ``scaler.failed`` (+ captured output), mark the agent failed, release its reservation.

    Called once the backend's failure path removed what the spawn created, so the state change is
    a compare-and-swap from any state in ``scalers.backends.failure.SPAWN_FAILURE_ENDS``: an agent
    that registered (``running``) or was drained while its spawn was still finishing ends
    ``failed`` too, instead of staying active with no sandbox. The event and the release happen
    regardless (both idempotent in effect), so a spawn someone else gave up on still reports why.
    """
    from scalers.backends.failure import failure_detail, mark_spawn_failed

    if isinstance(error, BaseException):
        captured = list(captured or getattr(error, "captured_output", None) or [])
    detail = failure_detail(error if isinstance(error, BaseException) else RuntimeError(error), captured or [])
    stage = getattr(error, "stage", "")
    now = timezone.now()
    with transaction.atomic():
        mark_spawn_failed(agent.pk, detail, now)
        if not getattr(error, "event_recorded", False):  # a backend that reported its own failure
            record_event(agent, EventType.FAILED, detail, payload={"stage": stage, "reason": reason})
    try:
        from agents.tokens import revoke_agent_tokens

        revoke_agent_tokens(agent)
    except Exception:  # noqa: BLE001
        log.warning("could not revoke tokens of %s", agent.agent_id, exc_info=True)
    release_reservation(agent, reason)


def spawn_agent(agent_pk: int) -> str:
    """The rq job: spawn one admitted agent. Returns ``spawned``, ``failed`` or ``skipped``.

    Skips an agent that is no longer ``spawning`` (cancelled before the job ran). Sets
    ``spawn_started_at`` once (the deadline counts from it), runs the backend spawn, stores the
    result and schedules :func:`expire_spawn` at the deadline.
    """
    from scalers.backends.base import SpawnControl, get_backend

    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state != AgentState.SPAWNING:
        return "skipped"
    now = timezone.now()
    if Agent.objects.filter(pk=agent.pk, spawn_started_at__isnull=True).update(spawn_started_at=now):
        agent.spawn_started_at = now
    control = SpawnControl(deadline=_deadline(agent), cancelled=lambda: _cancel_reason(agent.pk))
    try:
        backend = get_backend(agent.scaler)
        result = backend.spawn(agent, control)
    except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
        log.info("spawn of %s failed: %s", agent.agent_id, exc)
        fail_spawn(agent, exc, reason="spawn-timeout" if getattr(exc, "reason", "") == "deadline" else "spawn-failed")
        return "failed"
    fields = {"managed_id": result.managed_id, "backend_context": result.context}
    if result.ip:
        fields["ip"] = result.ip
    if result.host_access is not None:
        fields["host_access"] = result.host_access
        fields["host_access_explicit"] = result.host_access_explicit
    Agent.objects.filter(pk=agent.pk).update(**fields)
    schedule_expiry(agent)
    waiter = getattr(backend, "await_registration", None)  # firecracker: its boot watcher lives in this process
    return waiter(agent, control) if waiter is not None else "spawned"


def schedule_expiry(agent: Agent) -> None:
    """Schedule :func:`expire_spawn` at the agent's spawn deadline (needs a worker ``--with-scheduler``;
    ``expire_overdue_spawns`` is the periodic backstop)."""
    when = datetime.fromtimestamp(_deadline(agent), tz=UTC)
    try:
        host_queue().enqueue_at(
            when,
            expire_spawn,
            agent.pk,
            job_id=f"expire-{agent.agent_id}",
            description=f"registration deadline of {agent.agent_id}",
        )
    except Exception:  # noqa: BLE001 - the periodic sweep still catches it
        log.warning("could not schedule the registration deadline of %s", agent.agent_id, exc_info=True)


def expire_spawn(agent_pk: int, *, now: datetime | None = None) -> bool:
    """Give up on an agent still ``spawning`` past its deadline (the registration wait).

    Captures its output, then ``scalers.admission.fail_spawn``: ``scaler.failed`` ("did not
    register within N s" + captured output), destroy through the backend, mark failed and release
    (a destroy that fails keeps the reservation for the sweeper to retry). Returns True
    when it expired the agent, False when it registered, was already handled, or is not due.
    """
    from scalers.backends.base import get_backend

    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state != AgentState.SPAWNING:
        return False
    now = now or timezone.now()
    if now.timestamp() < _deadline(agent):
        return False
    backend = get_backend(agent.scaler)
    captured: list[str] = []
    try:
        capture = getattr(backend, "captured_output_for", None)
        if capture:
            captured = capture(agent)
    except Exception:  # noqa: BLE001 - the output is a courtesy
        log.warning("could not capture the output of %s", agent.agent_id, exc_info=True)
    from scalers.backends.failure import failure_detail

    error = RuntimeError(f"agent did not register within {spawn_timeout_seconds()} s")
    from agents.tokens import revoke_agent_tokens

    revoke_agent_tokens(agent)  # a late registration must not revive it
    try:
        from scalers.admission.release import fail_spawn as admission_fail_spawn
    except ImportError:
        admission_fail_spawn = None
    if admission_fail_spawn is not None:
        # destroy first, release only once destroy succeeded (else the sweeper retries)
        admission_fail_spawn(
            agent, failure_detail(error, captured), reason="spawn-timeout", destroy_reason="spawn-timeout"
        )
        return True
    try:
        backend.destroy(agent, reason="spawn-timeout")
    except Exception:  # noqa: BLE001 - report the expiry anyway; the orphan sweep is the backstop
        log.warning("could not destroy the expired spawn %s", agent.agent_id, exc_info=True)
    fail_spawn(agent, error, captured=captured, reason="spawn-timeout")
    return True


def expire_overdue_spawns(now: datetime | None = None) -> int:
    """Expire every ``spawning`` agent whose spawn started longer ago than the timeout. Returns the count."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=spawn_timeout_seconds())
    pks = Agent.objects.filter(state=AgentState.SPAWNING, spawn_started_at__lte=cutoff).values_list("pk", flat=True)
    return sum(1 for pk in list(pks) if expire_spawn(pk, now=now))


def spawn_job_failed(job, connection, type, value, traceback):  # noqa: A002 - rq's callback signature
    """rq ``on_failure`` callback of :func:`spawn_agent` (hard kill, timeout, crash).

    Hands over to ``scalers.admission.on_spawn_job_failure`` (same arguments), which tears the
    sandbox down through the backend and releases the reservation. Without admission installed,
    destroys through the backend and fails the spawn itself.
    """
    try:
        from scalers.admission.release import on_spawn_job_failure
    except ImportError:
        on_spawn_job_failure = None
    if on_spawn_job_failure is not None:
        on_spawn_job_failure(job, connection, type, value, traceback)
        return
    from scalers.backends.base import get_backend

    agent_pk = job.args[0] if job.args else None
    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first() if agent_pk else None
    if agent is None or agent.state != AgentState.SPAWNING:
        return
    try:
        get_backend(agent.scaler).destroy(agent, reason="spawn-failed")
    except Exception:  # noqa: BLE001
        log.warning("cleanup after the failed spawn job of %s failed", agent.agent_id, exc_info=True)
    fail_spawn(agent, value if isinstance(value, BaseException) else RuntimeError(str(value)), reason="spawn-failed")


def enqueue_destroy(agent: Agent, reason: str = "shutdown") -> None:
    """Enqueue :func:`destroy_agent` on the host queue (on commit)."""
    host_queue().enqueue(destroy_agent, agent.pk, reason, job_timeout=120, description=f"destroy {agent.agent_id}")


def destroy_agent(agent_pk: int, reason: str = "shutdown") -> bool:
    """Tear one agent down: ``destroying`` → backend destroy → ``destroyed``, ``agent.destroyed``,
    tokens revoked, reservation released. Idempotent; False when it was already terminal."""
    from agents.tokens import revoke_agent_tokens
    from scalers.backends.base import get_backend

    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state in TERMINAL_STATES:
        return False
    Agent.objects.filter(pk=agent.pk).exclude(state__in=TERMINAL_STATES).update(state=AgentState.DESTROYING)
    get_backend(agent.scaler).destroy(agent, reason=reason)
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED, finished_at=timezone.now())
        record_event(agent, EventType.DESTROYED, reason)
    revoke_agent_tokens(agent)
    release_reservation(agent, reason)
    return True
