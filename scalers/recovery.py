"""Recovery on boot and on leader change: end this instance's spawns that could never complete
(sandbox destroyed first, then the reservation released), drop reservations nothing backs, keep
everything else, report the counts. What is dropped and why: ``docs/recovery.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

import django_rq
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from rq.job import Job, JobStatus

from agents.choices import ACTIVE_STATES, AgentState, EventType
from agents.events import record_event
from agents.models import Agent, AgentToken
from scalers.admission import ledger
from scalers.choices import LOCAL_SCALER_TYPES
from scalers.lifecycle import teardown_agent
from scalers.models import RecoveryReport, Reservation, this_host

log = logging.getLogger("scalers.admission")

#: rq statuses of a spawn job still to run or running. Compared as ``JobStatus`` members: ``str()``
#: of one is ``"JobStatus.QUEUED"``, not its value.
_ALIVE_RQ_STATES = frozenset({JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED})
#: Seconds after a spawn slot was claimed (``rq_job_id`` written, ``updated_at`` stamped) during
#: which a job rq does not know yet is still being enqueued, not lost.
ENQUEUE_GRACE_SECONDS = 30
DROPPED_SPAWN = "dropped at recovery: a local spawn does not survive the process that ran it"


@dataclass(frozen=True)
class ScalerStateRecovery:
    """Counts of one recovery."""

    spawning_agents_rehydrated: int = 0
    spawning_dropped: int = 0
    agent_jobs_rehydrated: int = 0
    reservations_rehydrated: int = 0
    reservations_dropped: int = 0
    buffered_events_lost: int = 0


def rq_job_alive(agent: Agent) -> bool:
    """True when the agent's spawn job is queued/started/deferred/scheduled in rq, or when it has
    none yet: it waits for a spawn slot (``scalers.jobs.start_waiting_spawns``), nothing of it runs.

    Redis unreachable ⇒ True (do not drop what might be running; the stale prune and the token
    TTL catch it later). A job rq does not know is alive for :data:`ENQUEUE_GRACE_SECONDS` after
    the slot was claimed and before the job started (``spawn_started_at`` unset): the claim is
    committed before the job reaches Redis, and recovery may look in between.
    """
    if not agent.rq_job_id:
        return True
    try:
        job = Job.fetch_many(
            [agent.rq_job_id], connection=django_rq.get_connection("default"), serializer=settings.KICI_JOB_SERIALIZER
        )[0]
    except Exception as exc:  # noqa: BLE001
        log.warning("recovery: cannot ask rq about %s (%s); keeping it", agent.agent_id, exc)
        return True
    if job is None:
        claimed = agent.updated_at
        return (
            agent.spawn_started_at is None
            and claimed is not None
            and (timezone.now() - claimed).total_seconds() < ENQUEUE_GRACE_SECONDS
        )
    return job.get_status(refresh=False) in _ALIVE_RQ_STATES


def recover_state(
    instance_id: str | None = None,
    *,
    trigger: str = "boot",
    spawn_alive: Callable[[Agent], bool] = rq_job_alive,
) -> ScalerStateRecovery:
    """Reconcile this instance's spawning agents and reservations; report and store the counts.

    ``instance_id`` defaults to ``settings.KICI_INSTANCE_ID``; ``trigger`` is ``boot``,
    ``leader-change`` or ``manual``; ``spawn_alive(agent)`` tells whether a local spawn is still
    in progress elsewhere (default: its rq job is alive). Runs under the admission lock in one
    transaction. Any error is logged, stored in the :class:`RecoveryReport` and answered with
    zero counts. Never raises.
    """
    instance_id = instance_id or settings.KICI_INSTANCE_ID
    try:
        result, dropped = _recover(instance_id, spawn_alive)
        error = ""
    except Exception as exc:  # a failed recovery must not stop the console
        log.exception("scaler state recovery failed; starting empty")
        result, dropped, error = ScalerStateRecovery(), [], f"{type(exc).__name__}: {exc}"
    for agent in dropped:
        _end_dropped_spawn(agent)
    RecoveryReport.objects.create(instance_id=instance_id, trigger=trigger, error=error, **asdict(result))
    log.info(
        "scaler state recovery (%s, instance %s): spawning_agents_rehydrated=%d spawning_dropped=%d "
        "agent_jobs_rehydrated=%d reservations_rehydrated=%d reservations_dropped=%d buffered_events_lost=%d",
        trigger,
        instance_id,
        result.spawning_agents_rehydrated,
        result.spawning_dropped,
        result.agent_jobs_rehydrated,
        result.reservations_rehydrated,
        result.reservations_dropped,
        result.buffered_events_lost,
    )
    if result.reservations_dropped:
        log.warning("recovery dropped %d reservation rows no spawn backs", result.reservations_dropped)
    return result


def _end_dropped_spawn(agent: Agent) -> None:
    """Destroy a dropped spawn's sandbox (it may have been started), then mark it failed and
    release its reservation. A destroy that fails leaves it ``destroying`` with its reservation:
    the sweeper retries (``retry_stuck_teardowns``). The sandbox of another host's scaler is only
    that host's to remove: the agent is left ``destroying`` (with its failure reason), and that
    host's sweeper's ``retry_stuck_teardowns`` ends it (docs/multi-host.md)."""
    if agent.scaler.host != this_host():
        return
    try:
        teardown_agent(
            agent, "recovery", final_state=AgentState.FAILED, failure_reason=DROPPED_SPAWN, destroy_reason="shutdown"
        )
    except Exception:  # the agent stays destroying; the sweeper retries
        log.exception("recovery: the teardown of %s failed; the sweeper retries it", agent.agent_id)


def _recover(instance_id: str, spawn_alive: Callable[[Agent], bool]) -> tuple[ScalerStateRecovery, list[Agent]]:
    """The counts, and the dropped spawns (now ``destroying``, tokens revoked) that the caller
    tears down once the admission lock is released."""
    now = timezone.now()
    with transaction.atomic():
        with connection.cursor() as cur:
            ledger.lock_admission(cur)
        spawning = list(
            Agent.objects.select_related("scaler").filter(owner_instance=instance_id, state=AgentState.SPAWNING)
        )
        dropped_ids: set[int] = set()
        for agent in spawning:
            if agent.scaler.type not in LOCAL_SCALER_TYPES or spawn_alive(agent):
                continue
            # Not failed yet: the sandbox may have been started. It keeps its slot until
            # _end_dropped_spawn has destroyed it. Compare-and-swap on spawning: a spawn job that
            # finished since the row was read (rq says finished, the agent is connecting or
            # running now) survived, and its agent is left alone.
            if Agent.objects.filter(pk=agent.pk, state=AgentState.SPAWNING).update(
                state=AgentState.DESTROYING, updated_at=now, failure_reason=DROPPED_SPAWN
            ):
                dropped_ids.add(agent.pk)
        if dropped_ids:
            # Their tokens are void from now on.
            AgentToken.objects.filter(agent_id__in=dropped_ids, expires_at__gt=now).update(expires_at=now)
        # Event spawns: the prune clock starts at spawnedAt when the spawn never recorded a start.
        Agent.objects.filter(
            owner_instance=instance_id, state=AgentState.SPAWNING, spawn_started_at__isnull=True
        ).exclude(pk__in=dropped_ids).exclude(scaler__type__in=list(LOCAL_SCALER_TYPES)).update(
            spawn_started_at=F("created_at")
        )

        rehydrated_res = 0
        dropped_res: list[Reservation] = []
        for res in Reservation.objects.select_related("agent", "agent__scaler").filter(owner_instance=instance_id):
            if res.agent_id in dropped_ids:
                continue  # released by the teardown of the dropped spawn, once its sandbox is gone
            backed = res.agent.state in ACTIVE_STATES
            if backed:
                rehydrated_res += 1
            else:
                dropped_res.append(res)
        if dropped_res:
            Reservation.objects.filter(pk__in=[r.pk for r in dropped_res]).delete()
            for res in dropped_res:
                record_event(res.agent, EventType.RELEASED, detail="recovery", payload={"reason": "recovery"})
        agent_jobs = Agent.objects.filter(state__in=ACTIVE_STATES).exclude(bound_job_id="").count()
    counts = ScalerStateRecovery(
        spawning_agents_rehydrated=len(spawning) - len(dropped_ids),
        spawning_dropped=len(dropped_ids),
        agent_jobs_rehydrated=agent_jobs,
        reservations_rehydrated=rehydrated_res,
        reservations_dropped=len(dropped_res),
        buffered_events_lost=0,
    )
    # Read again: the teardown destroys what the row records now (a pid or container written by
    # the spawn job after the first read).
    return counts, list(Agent.objects.select_related("scaler").filter(pk__in=dropped_ids).order_by("pk"))
