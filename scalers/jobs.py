"""rq jobs that run spawns on the queue of the scaler's host (``scalers.hosts``); the teardown and
reclaim jobs are ``scalers.lifecycle``'s. How the spawn semaphore, the spawn job and the
registration watch fit: docs/lifecycle.md ("Spawn jobs")."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from rq import Callback

from agents.choices import AgentState
from agents.heartbeats import push_admitted_row
from agents.models import Agent
from scalers.admission.decide import Admitted, ScaleDecision, spawn_job_id
from scalers.backends.base import SpawnControl
from scalers.backends.factory import get_backend
from scalers.hosts import host_queue_name, queue_named, scaler_queue
from scalers.kici_agents import is_kici_agent, schedule_follow
from scalers.lifecycle import (
    CLEANUP_JOB_TIMEOUT_SECONDS,
    awaits_the_reaper,
    expire_registration,
    fail_connecting,
    fail_spawn,
    on_spawn_job_failure,
    registration_deadline,
    spawn_timeout_seconds,
)
from scalers.metrics import SPAWN_DURATION, observe
from scalers.models import ScaleOutcome, Scaler
from scalers.spawn_trace import record_marks

log = logging.getLogger(__name__)

#: Seconds the rq job may run past the spawn deadline to clean up after giving up.
CLEANUP_GRACE_SECONDS = 30
#: Seconds between two looks of :func:`watch_registration` at a connecting agent whose backend
#: can tell a failed boot (``boot_failure``).
BOOT_CHECK_SECONDS = 1.0


def enqueue_spawn(agent: Agent | Admitted, host: str = "") -> str:
    """Enqueue ``spawn_agent(agent.pk)`` on its scaler's host queue now and return its job id.
    ``agent``: the row, or an admission's ``Admitted`` record; one whose slot its caller claimed in
    its own transaction (``rq_job_id`` already set) is enqueued as it is, otherwise the job id is
    recorded first. ``host``: the scaler's host when the caller knows it, else read. Callers go
    through the spawn semaphore; timeout and failure callback: docs/lifecycle.md ("Spawn jobs").
    """
    job_id = spawn_job_id(agent.agent_id)
    if agent.rq_job_id != job_id:
        # updated_at stamps the claim: recovery gives a job rq does not know yet a grace from it.
        Agent.objects.filter(pk=agent.pk).update(rq_job_id=job_id, updated_at=timezone.now())
        if isinstance(agent, Agent):  # an Admitted is frozen: it is only ever enqueued with its job id
            agent.rq_job_id = job_id
    if host:
        queue = queue_named(host_queue_name(host))
    else:
        assert isinstance(agent, Agent), "an admission's record is enqueued with its scaler's host"
        queue = scaler_queue(agent.scaler)
    timeout = spawn_timeout_seconds() + CLEANUP_GRACE_SECONDS
    queue.enqueue(
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


def start_waiting_spawns(scaler_id: int) -> set[int]:
    """Give free spawn slots of scaler ``scaler_id`` to its oldest waiting agents and enqueue their
    spawn jobs. Returns the pks of agents failed because their job could not be enqueued.

    In flight: ``spawning`` with an ``rq_job_id`` (its job is queued or runs the backend call);
    waiting: ``spawning`` without one. Slots are taken under a lock on the scaler row, so
    concurrent callers never hand out more than ``maxConcurrentSpawns``. An agent whose job cannot
    be enqueued is failed and released (``enqueue-failed``) and its slot handed on.
    """
    with transaction.atomic():
        limit = (
            Scaler.objects.select_for_update()
            .filter(pk=scaler_id)
            .values_list("max_concurrent_spawns", flat=True)
            .first()
        )
        if limit is None:
            return set()
        spawning = Agent.objects.filter(scaler_id=scaler_id, state=AgentState.SPAWNING)
        free = limit - spawning.exclude(rq_job_id="").count()
        if free <= 0:
            return set()
        chosen = list(spawning.filter(rq_job_id="").order_by("created_at", "pk")[:free])
        for agent in chosen:
            agent.rq_job_id = spawn_job_id(agent.agent_id)
            Agent.objects.filter(pk=agent.pk).update(rq_job_id=agent.rq_job_id, updated_at=timezone.now())
    failed = {agent.pk for agent in chosen if not _enqueue_or_fail(agent)}
    if failed:
        failed |= start_waiting_spawns(scaler_id)
    return failed


def _enqueue_or_fail(agent: Agent | Admitted, host: str = "") -> bool:
    """Enqueue the spawn of ``agent``, whose slot is claimed; when that fails, fail the agent and
    release it (``enqueue-failed``: an admission must not outlive a lost spawn). False then; the
    caller hands its slot on."""
    try:
        enqueue_spawn(agent, host)
        return True
    except Exception as exc:  # noqa: BLE001 - whatever rq raised, the agent must not hold its slot
        log.warning("could not enqueue the spawn of %s: %s", agent.agent_id, exc)
        fail_spawn(
            Agent.objects.select_related("scaler").get(pk=agent.pk),
            f"could not enqueue the spawn: {exc}",
            reason="enqueue-failed",
        )
        return False


def start_all_waiting_spawns() -> int:
    """:func:`start_waiting_spawns` for every scaler with a waiting agent (the sweeper's backstop
    for a slot freed where nobody re-drove it, e.g. a job lost with its worker). Returns how many
    spawns were started."""
    waiting = Agent.objects.filter(state=AgentState.SPAWNING, rq_job_id="")
    before = waiting.count()
    for scaler_id in sorted(set(waiting.values_list("scaler_id", flat=True))):
        start_waiting_spawns(scaler_id)
    return before - waiting.count()


def _cancel_reason(agent_pk: int) -> str | None:
    state = Agent.objects.filter(pk=agent_pk).values_list("state", flat=True).first()
    if state is None:
        return "the agent row is gone"
    if state in (AgentState.SPAWNING, AgentState.RUNNING):
        return None  # running: the agent registered before the spawn finished its last steps
    return f"the agent is {state}"


def spawn_agent(agent_pk: int) -> str:
    """The rq job: spawn one admitted agent. Returns ``spawned``, ``failed`` or ``skipped`` (no longer
    ``spawning``). Sets ``spawn_started_at`` once (the deadline counts from it), runs the backend
    spawn, moves the agent to ``connecting`` by compare-and-swap (one that registered meanwhile stays
    ``running``), records its trace marks and schedules :func:`watch_registration` unless a reaper
    watches it; whatever the outcome, hands its slot on. Design: docs/lifecycle.md ("Spawn jobs").
    """
    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None:
        return "skipped"
    try:
        return _spawn(agent) if agent.state == AgentState.SPAWNING else "skipped"
    finally:
        start_waiting_spawns(agent.scaler_id)


def _spawn(agent: Agent) -> str:
    now = timezone.now()
    if Agent.objects.filter(pk=agent.pk, spawn_started_at__isnull=True).update(spawn_started_at=now):
        agent.spawn_started_at = now
    deadline = registration_deadline(agent).timestamp()
    control = SpawnControl(deadline=deadline, cancelled=lambda: _cancel_reason(agent.pk))
    control.mark("picked_up", now)
    started = time.monotonic()
    try:
        backend = get_backend(agent.scaler)
        result = backend.spawn(agent, control)
    except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
        observe(SPAWN_DURATION, {"scaler": agent.scaler.name, "result": "failed"}, time.monotonic() - started)
        return _spawn_failed(agent, exc)
    observe(SPAWN_DURATION, {"scaler": agent.scaler.name, "result": "spawned"}, time.monotonic() - started)
    fields: dict[str, object] = {"managed_id": result.managed_id, "backend_context": result.context}
    if result.ip:
        fields["ip"] = result.ip
    if result.bridge_port:
        fields["bridge_port"] = result.bridge_port
    if result.host_access is not None:
        fields["host_access"] = result.host_access
        fields["host_access_explicit"] = result.host_access_explicit
    Agent.objects.filter(pk=agent.pk).update(**fields)
    Agent.objects.filter(pk=agent.pk, state=AgentState.SPAWNING).update(
        state=AgentState.CONNECTING, updated_at=timezone.now()
    )
    control.mark("connecting")
    record_marks(agent, control.marks)
    agent.backend_context = result.context
    if is_kici_agent(agent):
        schedule_follow(agent)
    elif not awaits_the_reaper(agent):
        schedule_watch(agent, backend)
    return "spawned"


def _spawn_failed(agent: Agent, exc: Exception) -> str:
    """A spawn failed and the backend removed what it created: fail the agent and release its
    reservation (``fail_spawn`` with ``cleaned_up=True``)."""
    log.info("spawn of %s failed: %s", agent.agent_id, exc)
    fail_spawn(
        agent,
        exc,
        reason="spawn-timeout" if getattr(exc, "reason", "") == "deadline" else "spawn-failed",
        cleaned_up=True,
    )
    return "failed"


def schedule_watch(agent: Agent, backend) -> None:
    """Schedule the next :func:`watch_registration` of ``agent``: in :data:`BOOT_CHECK_SECONDS`
    (never past the deadline) when ``backend`` has ``boot_failure``, else at the deadline. Needs a
    worker ``--with-scheduler``; an enqueue failure is logged (the sweeper's prune still ends the
    agent at its deadline)."""
    deadline = registration_deadline(agent)
    when = deadline
    if getattr(backend, "boot_failure", None) is not None:
        when = min(deadline, timezone.now() + timedelta(seconds=BOOT_CHECK_SECONDS))
    try:
        scaler_queue(agent.scaler).enqueue_at(
            when,
            watch_registration,
            agent.pk,
            job_timeout=CLEANUP_JOB_TIMEOUT_SECONDS,
            result_ttl=60,
            failure_ttl=24 * 3600,
            description=f"registration watch of {agent.agent_id}",
        )
    except Exception:  # the periodic sweep still catches the deadline
        log.warning("could not schedule the registration watch of %s", agent.agent_id, exc_info=True)


def watch_registration(agent_pk: int) -> str:
    """The rq job of the registration wait: one look at a ``connecting`` agent, never a wait. Returns
    ``over`` (registered, ended by another path, or a delivered event provision the reaper waits
    for), ``expired`` (``scalers.lifecycle.expire_registration``), ``failed`` (the backend's
    ``boot_failure``: ``scalers.lifecycle.fail_connecting``, release reason ``spawn-failed``) or
    ``watching`` (:func:`schedule_watch`). Design: docs/lifecycle.md ("Spawn jobs").
    """
    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state != AgentState.CONNECTING or awaits_the_reaper(agent):
        return "over"
    if timezone.now() >= registration_deadline(agent):
        return "expired" if expire_registration(agent.pk) else "over"
    backend = get_backend(agent.scaler)
    check = getattr(backend, "boot_failure", None)
    failure = check(agent) if check is not None else None
    if failure is not None:
        log.info("boot of %s failed: %s", agent.agent_id, failure.detail)
        ended = fail_connecting(
            agent,
            failure.detail,
            captured=failure.captured,
            payload=failure.payload,
            reason="spawn-failed",
            destroy_reason="spawn-failed",
        )
        return "failed" if ended else "over"
    schedule_watch(agent, backend)
    return "watching"


def spawn_job_failed(job, connection, type, value, traceback):  # rq's callback signature
    """rq ``on_failure`` callback of :func:`spawn_agent` (hard kill, timeout, crash): hands over to
    ``scalers.lifecycle.on_spawn_job_failure``, which tears the sandbox down through the
    backend and releases the reservation, then hands the spawn slot on. Its dotted path is stored
    with every enqueued spawn."""
    on_spawn_job_failure(job, connection, type, value, traceback)
    scaler_id = Agent.objects.filter(rq_job_id=getattr(job, "id", "")).values_list("scaler_id", flat=True).first()
    if scaler_id is not None:
        start_waiting_spawns(scaler_id)


def enqueue_spawn_or_fail(decision: ScaleDecision, admitted: Admitted) -> ScaleDecision:
    """After the commit of its admission, start an admitted agent and return ``decision``: one that
    took a spawn slot in the admission transaction is enqueued (its slot handed on if that fails);
    one that waits is left to the spawn semaphore (:func:`start_waiting_spawns`), which is run now
    when the batch saw free slots behind waiting agents. When its spawn could not be enqueued (the
    agent is then failed and released), answer ``skipped``. The agent's row is announced to the
    live lists first (``agents.heartbeats.push_admitted_row``): it shows from its admission on."""
    push_admitted_row(admitted.agent_id, admitted.scaler_id)
    if admitted.rq_job_id:
        if _enqueue_or_fail(admitted, admitted.host):
            return decision
        start_waiting_spawns(admitted.scaler_id)
    elif not admitted.hand_on_slots or admitted.pk not in start_waiting_spawns(admitted.scaler_id):
        return decision
    reason = Agent.objects.filter(pk=admitted.pk).values_list("failure_reason", flat=True).first() or ""
    return ScaleDecision(
        ScaleOutcome.SKIPPED,
        scaler=decision.scaler,
        backend_type=decision.backend_type,
        reason=f"spawn queue unavailable: {reason.removeprefix('could not enqueue the spawn: ')}",
    )
