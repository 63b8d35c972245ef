"""rq jobs that run spawns on the host queue (``settings.KICI_HOST_QUEUE``); the teardown and
reclaim jobs are ``scalers.lifecycle``'s.

- :func:`enqueue_spawn` (called by admission inside its transaction) enqueues
  :func:`spawn_agent` when the transaction commits, with job id ``spawn-<agent id>``.
- :func:`spawn_agent` runs the backend's spawn under the spawn deadline
  (``spawn_started_at + settings.KICI_SPAWN_TIMEOUT_SECONDS``) and cancellation (the agent row
  leaving ``spawning``), then schedules :func:`expire_spawn` at the deadline: the registration
  wait. On any failure: ``scaler.failed`` (with captured output), the agent marked failed, what
  was created removed, the reservation released (``scalers.lifecycle.fail_spawn``).
- :func:`enqueue_spawn_or_fail` (admission's callers, after the commit) enqueues an admitted
  agent's spawn, or fails the agent when the queue is unavailable.
- The job timeout is the spawn timeout plus ``CLEANUP_GRACE_SECONDS``: the spawn itself gives
  up at the deadline and cleans up inside that grace; rq's hard kill and the failure callback
  :func:`spawn_job_failed` are the backstop for a job that hangs anyway.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone
from rq import Callback

from agents.choices import AgentState
from agents.models import Agent
from agents.tokens import revoke_agent_tokens
from scalers.admission.decide import Admitted, ScaleDecision
from scalers.backends.base import SpawnControl
from scalers.backends.factory import get_backend
from scalers.lifecycle import awaits_the_reaper, fail_spawn, host_queue, on_spawn_job_failure
from scalers.models import ScaleOutcome

log = logging.getLogger(__name__)

#: Seconds the rq job may run past the spawn deadline to clean up after giving up.
CLEANUP_GRACE_SECONDS = 30


def spawn_timeout_seconds() -> int:
    """The spawn deadline in seconds (``settings.KICI_SPAWN_TIMEOUT_SECONDS``)."""
    return int(settings.KICI_SPAWN_TIMEOUT_SECONDS)


def spawn_job_id(agent: Agent) -> str:
    return f"spawn-{agent.agent_id}"


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


def spawn_agent(agent_pk: int) -> str:
    """The rq job: spawn one admitted agent. Returns ``spawned``, ``failed`` or ``skipped``.

    Skips an agent that is no longer ``spawning`` (cancelled before the job ran). Sets
    ``spawn_started_at`` once (the deadline counts from it), runs the backend spawn, stores the
    result and schedules :func:`expire_spawn` at the deadline. A backend with ``await_registration``
    (firecracker) is then waited on until the boot is over; a boot that fails there is failed and
    released like a failed spawn.
    """
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
        return _spawn_failed(agent, exc)
    fields = {"managed_id": result.managed_id, "backend_context": result.context}
    if result.ip:
        fields["ip"] = result.ip
    if result.host_access is not None:
        fields["host_access"] = result.host_access
        fields["host_access_explicit"] = result.host_access_explicit
    Agent.objects.filter(pk=agent.pk).update(**fields)
    schedule_expiry(agent)
    waiter = getattr(backend, "await_registration", None)  # firecracker: its boot watcher lives in this process
    if waiter is None:
        return "spawned"
    try:
        return waiter(agent, control, spawn_timeout_seconds())
    except Exception as exc:  # noqa: BLE001 - the boot failed after spawn returned; the backend cleaned up
        return _spawn_failed(agent, exc)


def _spawn_failed(agent: Agent, exc: Exception) -> str:
    """A spawn (or the boot it waited for) failed and the backend removed what it created: fail the
    agent and release its reservation (``fail_spawn`` with ``cleaned_up=True``)."""
    log.info("spawn of %s failed: %s", agent.agent_id, exc)
    fail_spawn(
        agent,
        exc,
        reason="spawn-timeout" if getattr(exc, "reason", "") == "deadline" else "spawn-failed",
        cleaned_up=True,
    )
    return "failed"


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

    Captures its output, revokes its tokens (a late registration must not revive it), then
    ``fail_spawn``: ``scaler.failed`` ("did not register within N s" + captured output), destroy
    through the backend, mark failed and release (a destroy that fails keeps the reservation for
    the sweeper to retry). Returns True when it expired the agent, False when it registered, was
    already handled, is not due, or is an event provision the reaper ends
    (``scalers.lifecycle.awaits_the_reaper``).
    """
    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state != AgentState.SPAWNING or awaits_the_reaper(agent):
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
    error = RuntimeError(f"agent did not register within {spawn_timeout_seconds()} s")
    revoke_agent_tokens(agent)
    fail_spawn(agent, error, captured=captured, reason="spawn-timeout", destroy_reason="spawn-timeout")
    return True


def expire_overdue_spawns(now: datetime | None = None) -> int:
    """Expire every ``spawning`` agent whose spawn started longer ago than the timeout. Returns the count."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=spawn_timeout_seconds())
    pks = Agent.objects.filter(state=AgentState.SPAWNING, spawn_started_at__lte=cutoff).values_list("pk", flat=True)
    return sum(1 for pk in list(pks) if expire_spawn(pk, now=now))


def spawn_job_failed(job, connection, type, value, traceback):  # noqa: A002 - rq's callback signature
    """rq ``on_failure`` callback of :func:`spawn_agent` (hard kill, timeout, crash): hands over to
    ``scalers.lifecycle.on_spawn_job_failure``, which tears the sandbox down through the
    backend and releases the reservation. Its dotted path is stored with every enqueued spawn."""
    on_spawn_job_failure(job, connection, type, value, traceback)


def enqueue_spawn_or_fail(decision: ScaleDecision, agent: Agent | Admitted) -> ScaleDecision:
    """Enqueue an admitted agent's spawn (``agent``: an ``Agent`` or a batch's ``Admitted``) and
    return ``decision``; when that fails, fail the agent, release its reservation and answer
    ``skipped``."""
    if isinstance(agent, Admitted):
        agent = agent.to_agent()
    try:
        enqueue_spawn(agent)
    except Exception as exc:  # noqa: BLE001 - the admission must not outlive a lost spawn
        log.warning("could not enqueue the spawn of %s: %s", agent.agent_id, exc)
        fail_spawn(
            Agent.objects.select_related("scaler").get(pk=agent.pk),
            f"could not enqueue the spawn: {exc}",
            reason="enqueue-failed",
        )
        return ScaleDecision(
            ScaleOutcome.SKIPPED,
            scaler=decision.scaler,
            backend_type=decision.backend_type,
            reason=f"spawn queue unavailable: {exc}",
        )
    return decision
