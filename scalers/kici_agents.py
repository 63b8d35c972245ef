"""Following a real KiCI agent (label set ``kiciAgent``) through its life, from outside it: the
real agent never speaks to the console, so :func:`follow_kici_agent` (a short rq job that looks
once and schedules itself again) reads the orchestrator's list of registered agents (one answer
shared by the follows of all its agents for :data:`TOPOLOGY_SHARED_MS`), the sandbox, and the
agent's own log (``scalers.kici_agent_log``: busy, idle, refused). What one look decides, and how
a lost follow resumes: docs/real-kici-agent.md ("How the console knows what the agent does").
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol, cast

from django.db import transaction
from django.db.models import F, Func, JSONField, Value
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.heartbeats import push_heartbeat_row
from agents.models import Agent
from scalers.backends.factory import get_backend
from scalers.hosts import scaler_queue
from scalers.kici_agent_log import BUSY, Activity, latest_activity, refusal
from scalers.kici_orchestrator import (
    KICI_TOKEN_ID,
    KiciAgentTarget,
    OrchestratorError,
    connected_agent_ids,
    kici_agent_target,
    token_last_seen,
)
from scalers.lifecycle import (
    CLEANUP_JOB_TIMEOUT_SECONDS,
    fail_connecting,
    registration_deadline,
    spawn_timeout_seconds,
    teardown_agent,
)
from scalers.metrics import SCALE_TO_REGISTERED, observe
from scalers.models import this_host


class _Sandboxes(Protocol):
    """What the follow asks of the backend running the real agent (container, Firecracker or
    bare-metal process): how its sandbox ended (None while it runs), its last output, the last
    lines of the agent's own log (``scalers.kici_agent_log``), and the news that the agent
    registered (a microVM's MMDS then drops the token, as the reference does on the agent's
    ``config.ack``)."""

    def sandbox_exit(self, agent: Agent) -> str | None: ...

    def captured_output_for(self, agent: Agent) -> list[str]: ...

    def agent_log_lines(self, agent: Agent) -> list[str]: ...

    def sandbox_registered(self, agent: Agent) -> None: ...


log = logging.getLogger(__name__)

#: Seconds between two looks at a real KiCI agent.
FOLLOW_SECONDS = 1.0
#: Seconds after its last scheduling that an agent's follow counts as lost (:func:`resume_follows`).
FOLLOW_LOST_SECONDS = 30
#: Milliseconds one answer of an orchestrator's fleet topology (or its failure) serves the follows
#: of all its agents (:func:`shared_listing`): under :data:`FOLLOW_SECONDS`, so each round asks it
#: about once whatever the number of agents.
TOPOLOGY_SHARED_MS = 900
#: ``backend_context`` key of what a real agent does (``scalers.kici_agent_log.Activity``).
KICI_ACTIVITY = "kici_activity"

_FOLLOWED = (AgentState.CONNECTING, AgentState.RUNNING, AgentState.DRAINING)


def is_kici_agent(agent: Agent) -> bool:
    """Whether ``agent``'s sandbox runs the real KiCI agent (its label set has ``kiciAgent``)."""
    return agent.label_set_id is not None and kici_agent_target(agent.label_set) is not None


def _follow_key(agent: Agent) -> str:
    return f"kici:follow:{agent.pk}"


def schedule_follow(agent: Agent, delay: float = FOLLOW_SECONDS) -> None:
    """Schedule the next :func:`follow_kici_agent` of ``agent`` in ``delay`` seconds (needs a
    worker ``--with-scheduler``) and mark its follow alive for :data:`FOLLOW_LOST_SECONDS`; an
    enqueue failure is logged, :func:`resume_follows` and the sweeper's backstops remain."""
    try:
        queue = scaler_queue(agent.scaler)
        queue.connection.set(_follow_key(agent), 1, ex=FOLLOW_LOST_SECONDS)
        queue.enqueue_in(
            timedelta(seconds=delay),
            follow_kici_agent,
            agent.pk,
            job_timeout=CLEANUP_JOB_TIMEOUT_SECONDS,
            result_ttl=60,
            failure_ttl=24 * 3600,
            description=f"follow the KiCI agent {agent.agent_id}",
        )
    except Exception:  # the deadline prune and lost-agent sweep still end it
        log.warning("could not schedule the follow of %s", agent.agent_id, exc_info=True)


def resume_follows() -> int:
    """The sweeper's unit: schedule a follow for each live real KiCI agent of this host's scalers
    whose follow was not scheduled for :data:`FOLLOW_LOST_SECONDS` (lost with Redis, or with a
    worker killed mid-look). The mark is claimed atomically (``SET NX``), so two sweepers or a live
    follow never start a second chain. Returns how many follows it resumed."""
    resumed = 0
    live = Agent.objects.filter(scaler__host=this_host(), state__in=_FOLLOWED, label_set__isnull=False)
    for agent in live.select_related("scaler", "label_set"):
        if not is_kici_agent(agent):
            continue
        if scaler_queue(agent.scaler).connection.set(_follow_key(agent), 1, ex=FOLLOW_LOST_SECONDS, nx=True):
            log.info("resuming the follow of the KiCI agent %s", agent.agent_id)
            schedule_follow(agent, delay=0)
            resumed += 1
    return resumed


def follow_kici_agent(agent_pk: int) -> str:
    """The rq job: :func:`look_at` once, then schedule itself again while the agent lives.
    Returns the look's outcome, or ``over`` for an agent that ended by another path."""
    agent = Agent.objects.select_related("scaler", "label_set").filter(pk=agent_pk).first()
    if agent is None or agent.state not in _FOLLOWED or not is_kici_agent(agent):
        return "over"
    connection = scaler_queue(agent.scaler).connection
    outcome = look_at(agent, ask=lambda target: shared_listing(connection, target))
    if outcome in ("watching", "running"):
        schedule_follow(agent)
    return outcome


def shared_listing(connection, target: KiciAgentTarget) -> set[str]:
    """``connected_agent_ids(target)``, asked once per :data:`TOPOLOGY_SHARED_MS` for the follows
    of every agent of that admin URL and admin token: the answer (or the failure, raised again as
    :class:`OrchestratorError`) is kept that long in Redis (``connection``). Two follows that miss
    it at the same moment both ask; that is all a race costs."""
    key = "kici:topology:" + hashlib.sha256(f"{target.admin_url} {target.admin_token_ref}".encode()).hexdigest()[:24]
    kept = connection.get(key)
    if kept is not None:
        answer = json.loads(kept)
        if "error" in answer:
            raise OrchestratorError(answer["error"])
        return set(answer["ids"])
    try:
        ids = connected_agent_ids(target)
    except OrchestratorError as exc:
        connection.set(key, json.dumps({"error": str(exc)}), px=TOPOLOGY_SHARED_MS)
        raise
    connection.set(key, json.dumps({"ids": sorted(ids)}), px=TOPOLOGY_SHARED_MS)
    return ids


def look_at(agent: Agent, *, now=None, ask: Callable[[KiciAgentTarget], set[str]] = connected_agent_ids) -> str:
    """One look at a followed agent (module doc); ``ask`` gives the ids the orchestrator lists
    (the follow job shares one answer among the agents of an orchestrator: :func:`shared_listing`).
    Returns ``watching`` (connecting, not yet listed), ``running`` (listed, or its sandbox still
    runs), ``failed`` (exited before registering), ``refused`` (the orchestrator closed it with
    4010 before it registered), ``expired`` (unlisted at the deadline), ``destroyed`` (exited after
    registering: torn down) or ``over`` (another path ended it meanwhile)."""
    target = kici_agent_target(agent.label_set)
    assert target is not None, "only an agent of a kiciAgent label set is followed"
    backend = cast(_Sandboxes, get_backend(agent.scaler))  # kiciAgent runs only where sandbox_exit exists
    exited = backend.sandbox_exit(agent)
    try:
        listed: bool | None = agent.agent_id in ask(target)
        asked = ""
    except OrchestratorError as exc:
        listed, asked = None, str(exc)
    now = now or timezone.now()
    if agent.state == AgentState.CONNECTING:
        if listed:
            if not _registered(agent, target, now):
                return "over"
            _tell_sandbox(backend, agent)
            return "running"
        refused = refusal(backend.agent_log_lines(agent)) if exited is None else None
        if exited is None and refused is None and now < registration_deadline(agent):
            return "watching"
        answer = _orchestrator_answer(agent, target, listed, asked)
        if exited is not None:
            detail = f"the KiCI agent {exited} without registering with {target.ws_url}"
            reason, outcome = "spawn-failed", "failed"
        elif refused is not None:
            detail = f"the KiCI agent was refused by {target.ws_url}, which {refused}; it stays up without retrying"
            reason, outcome = "spawn-failed", "refused"
        else:
            detail = f"the KiCI agent did not register within {spawn_timeout_seconds()} s with {target.ws_url}"
            reason, outcome = "spawn-timeout", "expired"
        ended = fail_connecting(
            agent,
            f"{detail}; the orchestrator {answer}",
            captured=backend.captured_output_for(agent),
            reason=reason,
            destroy_reason=reason,
        )
        return outcome if ended else "over"
    if exited is not None:
        reason = f"the KiCI agent {exited}" + (" (it shuts down once idle)" if exited.endswith("code 0") else "")
        teardown_agent(agent, reason, destroy_reason="agent-exited")
        return "destroyed"
    _note(agent, listed, latest_activity(backend.agent_log_lines(agent)), now)
    return "running"


def _note(agent: Agent, listed: bool | None, activity: Activity | None, now) -> None:
    """Store what a look at a live agent found: a heartbeat when the orchestrator lists it, and
    what it does when its log says something new (``active_jobs`` 1 or 0, ``backend_context``
    :data:`KICI_ACTIVITY`, merged into the stored context in the database so no other key is
    overwritten); the open pages' rows refresh when anything was stored."""
    fields: dict[str, object] = {"last_heartbeat": now} if listed else {}
    if activity is not None and activity != Activity.from_context((agent.backend_context or {}).get(KICI_ACTIVITY)):
        patch = {KICI_ACTIVITY: activity.as_context()}
        agent.active_jobs = fields["active_jobs"] = 1 if activity.state == BUSY else 0
        fields["backend_context"] = Func(
            F("backend_context"), Value(patch, output_field=JSONField()), function="", arg_joiner=" || "
        )
        agent.backend_context = {**(agent.backend_context or {}), **patch}
        log.info("the KiCI agent %s is %s", agent.agent_id, activity.text)
    if not fields:
        return
    Agent.objects.filter(pk=agent.pk, state__in=(AgentState.RUNNING, AgentState.DRAINING)).update(**fields)
    push_heartbeat_row(agent)


def _registered(agent: Agent, target: KiciAgentTarget, now) -> bool:
    """Move a connecting agent the orchestrator lists to ``running`` (compare-and-swap) and record
    ``agent.registered``; False when another path moved it first."""
    with transaction.atomic():
        won = Agent.objects.filter(pk=agent.pk, state=AgentState.CONNECTING).update(
            state=AgentState.RUNNING, registered_at=now, last_heartbeat=now, updated_at=now
        )
        if not won:
            return False
        agent.state, agent.registered_at, agent.last_heartbeat = AgentState.RUNNING, now, now
        record_event(
            agent,
            EventType.REGISTERED,
            f"the KiCI agent registered with {target.ws_url}",
            payload={"orchestrator": target.ws_url, "seenBy": "orchestrator fleet topology"},
        )
    observe(SCALE_TO_REGISTERED, {"scaler": agent.scaler.name}, (now - agent.created_at).total_seconds())
    return True


def _tell_sandbox(backend: _Sandboxes, agent: Agent) -> None:
    """``sandbox_registered``; a failure is logged (the agent runs; a microVM's MMDS keeps its
    token until the VM is gone, and the token is revoked with the agent)."""
    try:
        backend.sandbox_registered(agent)
    except Exception:  # the registration stands either way
        log.warning("could not tell the sandbox of %s that it registered", agent.agent_id, exc_info=True)


def _orchestrator_answer(agent: Agent, target: KiciAgentTarget, listed: bool | None, asked: str) -> str:
    """What the orchestrator says of an agent that did not register, for the failure text."""
    if listed is None:
        return f"could not be asked ({asked})"
    token_id = str((agent.backend_context or {}).get(KICI_TOKEN_ID, ""))
    token = f"; its token {token_id} was {token_last_seen(target, token_id)}" if token_id else ""
    return f"lists no agent {agent.agent_id} among those registered with it{token}"
