"""Deciding a batch of scale requests under the admission lock.

:func:`decide_batch` is the one place that admits: it takes the lock
(:func:`scalers.admission.ledger.lock_admission`), reads the usage snapshot, decides every request
of the batch in order against it (booking each admission into the snapshot, so request *n+1*
sees request *n*), and writes the agents, reservations, request records and counters in the same
transaction. One request or five hundred, it is one transaction and one lock hold; see
:mod:`scalers.admission.queue` for how concurrent callers are grouped into batches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agents.choices import LIVE_STATES, AgentState, EventType
from audit.choices import ActorKind, AuditAction
from audit.records import audit_fields
from lib.units import format_bytes_iec
from lib.wording import json_text
from scalers.choices import ScalerType
from scalers.hosts import scaler_host
from scalers.metrics import ORCH_REFUSALS, REDISPATCH, REFUSALS, WARM_SPAWNS, label_key
from scalers.models import ScaleOutcome
from scalers.pauses import pause_wording

from . import ledger
from .backoff import backoff_reason
from .caps import (
    COUNT_CAPS,
    NOT_IN_ORCH_REFUSAL_GAUGE,
    CapName,
    Usage,
    cap_exceeded_alone,
    first_refusing_cap,
    resource_cap_limits,
)
from .idempotency import LiveAgent, Verdict, scale_body, verdict
from .matching import LabelSetInfo, ScalerInfo, World, not_started_reason
from .validate import JobImage
from .warmfit import Shape, warm_agent_can_serve

log = logging.getLogger("scalers.admission")

LEDGER_WARNING = "refused a spawn on reserved capacity no running agent accounts for"


@dataclass(frozen=True)
class ScaleDecision:
    """The answer to one scale request. ``action`` (a :class:`scalers.models.ScaleOutcome`, the request
    record's ``outcome``): ``spawning`` or ``assigned`` (an idle warm agent bound; ``agent`` the agent
    id for both), ``at-capacity`` or ``exceeds-cap`` (``cap`` the refusing cap; the second can never
    be admitted while that cap stands), ``no-backend``, ``skipped``, and, written for neither,
    ``replayed`` (the job's live ``agent`` again; ``warm``) and ``idempotency-mismatch`` (``field``);
    ``paused`` (``pause`` says by whom and why). When each is given: docs/admission.md ("The order
    of the checks") and docs/api-contract.md.
    """

    action: ScaleOutcome
    agent: str | None = None
    scaler: str | None = None
    cap: str | None = None
    reason: str = ""
    backend_type: str | None = None
    agent_pk: int | None = None
    labels: tuple[str, ...] = ()
    warm: bool = False
    field: str | None = None
    #: ``paused``: the pause refusing it (``scalers.pauses.pause_json``).
    pause: dict | None = None

    @property
    def admitted(self) -> bool:
        return self.action == ScaleOutcome.SPAWNING


def scale_asked(job_id: str, event: dict | None) -> str:
    """What a scale request asked for, in the audit's words: ``job <id>``, or
    ``kici.scaler.scale-up of scaler <name>[ for job <id>]`` for a KiCI scale-up ``event``."""
    if event is None:
        return f"job {job_id}"
    job = f" for job {job_id}" if job_id else ""
    return f"kici.scaler.scale-up of scaler {event['scalerName']}{job}"


@dataclass
class Request:
    """One request to decide. ``target`` = ``(scaler pk, label set pk)`` skips routing (warm spawns)."""

    labels: tuple[str, ...]
    job_id: str
    resources: Any = None
    run_id: str = ""
    exclude: tuple[str, ...] = ()
    warm: bool = False
    target: tuple[int, int] | None = None
    job_image: JobImage | None = None
    raw_resources: Any = None  # as the caller sent it, for the request record
    #: The ``/scale`` ``Idempotency-Key`` header ("" for none; ``scalers.admission.idempotency``).
    idempotency_key: str = ""
    #: The name of the API token that asked (``scalers.api_tokens``; "" for an internal caller),
    #: kept on the request record and on the agent it admits or binds; an admission or bind it
    #: asked for is an ``api.scale`` audit record, written with the batch.
    token_name: str = ""
    #: A KiCI scale-up event (``scalers.admission.validate.KiciScaleUpBody``): the agent's id (not
    #: minted; one that exists already is refused, field ``agentId``), the labels it registers with,
    #: and the payload kept on it. Only a label set running the real KiCI agent of the payload's
    #: orchestrator takes it, and never an idle warm agent.
    agent_id: str = ""
    agent_labels: tuple[str, ...] = ()
    event: dict | None = None

    @cached_property
    def body(self) -> dict | None:
        """The request as kept on its agent and compared on a repeat; None for a warm spawn."""
        if self.warm:
            return None
        if self.event is not None:
            return self.event
        return scale_body(self.labels, self.raw_resources, self.run_id, self.exclude, self.job_image)


@dataclass(frozen=True)
class Admitted:
    """An agent admitted by a batch (written, committed with it): enough to enqueue its spawn."""

    pk: int
    agent_id: str
    scaler_id: int
    label_set_id: int | None
    labels: tuple[str, ...]
    warm: bool
    bound_job_id: str
    run_id: str
    owner_instance: str
    job_image: str = ""
    job_credentials_ref: str = ""
    #: The spawn job id when the agent took a spawn slot in its admission transaction; empty when
    #: it waits for one (``scalers.jobs.start_waiting_spawns`` gives it one as slots free).
    rq_job_id: str = ""
    #: The agent waits although its scaler had a free slot, because older agents wait for slots
    #: too: the caller hands the slots on after the commit, oldest first.
    hand_on_slots: bool = False
    #: The host owning the agent's scaler (its spawn goes to that host's queue).
    host: str = ""


@dataclass
class BatchResult:
    decisions: list[ScaleDecision]
    admitted: list[Admitted] = field(default_factory=list)


@dataclass(slots=True)
class _Spawn:
    """One admission being written (mutable until the batch statement runs): cpus in cores, mem in
    bytes; ``lcpus``/``lmem`` the label set's limits; ``slot`` whether it took a spawn slot."""

    index: int
    record: dict | None
    kind: str
    agent_id: str
    scaler_id: int
    label_set_id: int
    labels: tuple[str, ...]
    warm: bool
    job: str
    run: str
    pool_id: int | None
    cpus: float
    mem: int
    lcpus: float
    lmem: int
    job_image: str
    job_ref: str
    key: str
    body: dict | None
    token: str
    slot: bool = False
    #: Its id was given (a KiCI scale-up), not minted: never re-minted.
    given_id: bool = False


_COUNTER_KEYS: dict[tuple, tuple[str, str]] = {}


def _counter_key(name: str, labels: dict) -> tuple[str, str]:
    """``(name, label_key(labels))``, remembered (a few hundred distinct keys: counter names times
    scalers times caps; forgotten past 4096)."""
    memo = (name, *labels.items())
    key = _COUNTER_KEYS.get(memo)
    if key is None:
        if len(_COUNTER_KEYS) >= 4096:
            _COUNTER_KEYS.clear()
        key = _COUNTER_KEYS[memo] = (name, label_key(labels))
    return key


def spawn_job_id(agent_id: str) -> str:
    """The rq job id of an agent's spawn: ``spawn-<agent id>`` (one per agent: rq keeps one job per id)."""
    return f"spawn-{agent_id}"


def mint_agent_id(scaler_type: str) -> str:
    """``scaler-<type>-<8 random hex digits>`` (32 bits from the OS's random source, as the first
    8 hex digits of a UUID v4 are, without building one)."""
    return f"scaler-{scaler_type}-{os.urandom(4).hex()}"


def _backoffs(cursor, names: set[str], now: datetime) -> dict[str, str]:
    """Provision backoff reasons of event scalers (failures since the last registration)."""
    out = {}
    for name in names:
        cursor.execute(
            "SELECT count(*), max(created_at) FROM agents_scalerevent WHERE scaler_name = %s AND type = %s "
            "AND created_at > coalesce((SELECT max(created_at) FROM agents_scalerevent WHERE scaler_name = %s "
            "AND type = %s), '-infinity'::timestamptz)",
            [name, str(EventType.FAILED), name, str(EventType.REGISTERED)],
        )
        n, last = cursor.fetchone()
        reason = backoff_reason(name, n, last, now)
        if reason:
            out[name] = reason
    return out


def _exceeds_cap_reason(cap: CapName, info: ScalerInfo, world: World, cpus: float, mem: int) -> str:
    pool = world.pools.get(info.caps.machine_pool_id) if info.caps.machine_pool_id else None
    limit = resource_cap_limits(world.glob, info.caps, pool)[cap]
    assert limit is not None, f"{cap} is exceeded only where it is set"
    if cap.endswith(".cpu"):
        asked, allowed = f"{cpus:g} cpus", f"{limit:g} cpus"
    else:
        asked, allowed = f"{format_bytes_iec(mem)} of memory", format_bytes_iec(int(limit))
    return (
        f"request ({asked}) exceeds {cap} ({allowed}) on scaler {info.name} even with nothing else "
        "running: it can never be admitted while this cap stands"
    )


#: How often a batch is decided again when one of its minted agent ids already exists.
MINT_ATTEMPTS = 10


def decide_batch(
    requests: list[Request], *, instance_id: str | None = None, now: datetime | None = None
) -> BatchResult:
    """Decide ``requests`` in order under the admission lock, in one transaction (the caller's, under
    a savepoint, when there is one): each is refused naming why, answered with an idle warm agent or
    a live agent of its job, or admitted as a spawning Agent with its Reservation. The order of the
    checks, the round trips and the replay rule: docs/admission.md ("One batch", "One live agent
    per job"). Raises database errors, then nothing is written; ``RuntimeError`` when a minted
    agent id is taken :data:`MINT_ATTEMPTS` times. The caller enqueues the spawns of
    ``BatchResult.admitted`` after the commit.
    """
    instance_id = instance_id or settings.KICI_INSTANCE_ID
    now = now or timezone.now()
    connection.ensure_connection()
    conn = connection.connection
    own = not connection.in_atomic_block and connection.get_autocommit()
    live = False
    for _ in range(MINT_ATTEMPTS):
        try:
            if own:
                return _decide_in_own_transaction(conn, requests, instance_id, now, live)
            with transaction.atomic():  # a savepoint: a taken agent id undoes this batch only
                with psycopg.Cursor(conn) as cur:
                    return _decide(cur, requests, instance_id, now, commit=False, live=live)
        except psycopg.errors.UniqueViolation as exc:
            if ledger.live_agent_taken(exc):
                live = True
                log.info("a job or key of the batch of %d has a live agent: deciding it again", len(requests))
                continue
            if not ledger.agent_id_taken(exc):
                raise
            log.info("a minted agent id already exists: deciding the batch of %d again", len(requests))
    raise RuntimeError(f"could not decide the batch in {MINT_ATTEMPTS} attempts: its writes kept colliding")


def _decide_in_own_transaction(
    conn, requests: list[Request], instance_id: str, now: datetime, live: bool
) -> BatchResult:
    """Decide ``requests`` in a transaction of its own on ``conn`` (autocommit mode): see
    :func:`_decide`. Rolls back and re-raises on any error (nothing is written)."""
    try:
        with psycopg.Cursor(conn) as cur:
            return _decide(cur, requests, instance_id, now, commit=True, live=live)
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                pass  # the caller's error stands; a broken connection is closed by its owner
        raise


def _decide(cur, requests: list[Request], instance_id: str, now: datetime, *, commit: bool, live: bool) -> BatchResult:
    """Decide and write one batch: in a transaction of its own (``commit``) from the snapshot the
    connection's previous batch left when there is one and the batch reads nothing else (one round
    trip, guarded), else from a fresh one read under the lock with the live agents of the batch's jobs
    and keys (two); inside the caller's transaction, from a fresh one. ``live``: decide from a fresh
    one (a write found a live agent the held snapshot did not know). Design: docs/admission.md ("One
    batch").
    """
    conn = cur.connection
    held = ledger.take_held_snapshot(conn) if commit and not live else None
    if held is not None:
        routed = _route(held.world, requests)
        if not _reads_more(routed, requests):
            try:
                return _decide_routed(
                    cur,
                    requests,
                    routed,
                    held.world,
                    held.usage,
                    instance_id,
                    now,
                    commit=commit,
                    guard=held.digest,
                    live=None,
                )
            except ledger.SnapshotMoved:
                log.debug("the held admission snapshot moved: deciding the batch of %d again", len(requests))
    jobs = [r.job_id for r in requests if r.job_id and not r.warm]
    keys = [r.idempotency_key for r in requests if r.idempotency_key and not r.warm]
    _config_row, world, usage, rows = ledger.lock_and_snapshot(conn, begin=commit, jobs=jobs, keys=keys)
    routed = _route(world, requests)
    return _decide_routed(cur, requests, routed, world, usage, instance_id, now, commit=commit, guard=None, live=rows)


def _route(world: World, requests: list[Request]) -> list[tuple[ScalerInfo, LabelSetInfo] | None]:
    """Each request's scaler and label set (pure: from the World alone)."""
    routed: list[tuple[ScalerInfo, LabelSetInfo] | None] = []
    for req in requests:
        if req.target is not None:
            info = world.scalers.get(req.target[0])
            ls = info.label_set(req.target[1]) if info else None
            routed.append((info, ls) if info and ls and not info.retiring else None)
        else:
            routed.append(world.match(req.labels, req.exclude))
    return routed


def _reads_more(routed, requests: list[Request]) -> bool:
    """True when deciding the batch reads rows the snapshot does not hold (idle warm agents, an
    event scaler's provision backoff, whether a given agent id exists): then it is decided under
    the lock from a fresh snapshot."""
    return any(
        r.agent_id or (m and (m[0].type == ScalerType.EVENT or (m[0].warm_pool_enabled and not r.warm)))
        for m, r in zip(routed, requests, strict=True)
    )


def _decide_routed(
    cur,
    requests: list[Request],
    routed,
    world: World,
    usage: Usage,
    instance_id: str,
    now: datetime,
    *,
    commit: bool,
    guard: str | None,
    live: list[dict] | None,
) -> BatchResult:
    """Decide the routed batch against ``usage`` and write it. ``guard``: the digest of the held
    snapshot ``usage`` is (then the lock is taken in the write's round trip, and
    :class:`~scalers.admission.ledger.SnapshotMoved` raised if the state under it moved).
    ``live``: the live agents of the batch's jobs and keys (``ledger.lock_and_snapshot``); None
    when they were not read (a held snapshot): then the write checks under the lock that no job
    it refuses has a live agent (a repeat, whose answer is that agent), and fails as a moved
    snapshot when one has; a job it admits that has one fails on the unique index instead."""
    decider = _BatchDecider(cur, requests, routed, world, usage, now, live or [])
    for req, match in zip(requests, routed, strict=True):
        decider.decide(req, match)
    refused = None
    if live is None:
        admitted = (ScaleOutcome.SPAWNING, ScaleOutcome.ASSIGNED)
        asked = [
            (r.job_id, r.idempotency_key)
            for r, d in zip(requests, decider.decisions, strict=True)
            if r.job_id and not r.warm and d.action not in admitted
        ]
        refused = ([j for j, _ in asked], [k for _, k in asked if k])
    return decider.write(instance_id, now, commit=commit, guard=guard, refused=refused)


class _BatchDecider:
    """Decides the requests of one routed batch in order against ``usage``, then writes them.

    :meth:`decide` tries the steps in order (route, job image, host tools, provision backoff,
    resources, an idle warm agent, the caps, admission); each returns a decision or None to go on.
    Admissions are booked into ``usage`` so the next request sees them. Decisions, request
    records, counters and spawns accumulate here until :meth:`write`."""

    __slots__ = (
        "cur",
        "world",
        "usage",
        "backoffs",
        "idle",
        "taken",
        "decisions",
        "records",
        "counters",
        "spawns",
        "count_cap_refused",
        "by_job",
        "by_key",
        "replays",
        "ids_taken",
        "audited",
    )

    def __init__(
        self, cur, requests: list[Request], routed, world: World, usage: Usage, now: datetime, live: list[dict]
    ):
        """Reads what the snapshot does not hold, once per batch: the provision backoffs of the
        batch's event scalers and the idle warm agents of its warm-pool scalers. ``live``: the
        live agents of the batch's jobs and keys known so far (the batch adds its own)."""
        self.cur = cur
        self.world = world
        self.usage = usage
        event_names = {m[0].name for m in routed if m and m[0].type == ScalerType.EVENT}
        self.backoffs = _backoffs(cur, event_names, now) if event_names else {}
        warm_scalers = {
            m[0].pk for m, r in zip(routed, requests, strict=True) if m and not r.warm and m[0].warm_pool_enabled
        }
        self.idle = ledger.idle_warm_agents(cur, warm_scalers) if warm_scalers else []
        self.taken: set[int] = set()
        self.decisions: list[ScaleDecision] = []
        self.records: list[dict] = []
        self.counters: dict[tuple[str, str], tuple[dict, float]] = {}
        self.spawns: list[_Spawn] = []
        self.count_cap_refused = False
        self.by_job: dict[str, LiveAgent] = {}
        self.by_key: dict[str, LiveAgent] = {}
        #: Requests answered with an agent this batch admits: (decision index, its spawn).
        self.replays: list[tuple[int, _Spawn]] = []
        #: The given agent ids (KiCI scale-ups) that exist, with their state; the batch adds its own.
        self.ids_taken = _agent_ids_taken(cur, [r.agent_id for r in requests if r.agent_id])
        #: Admissions an API token asked for, audited with the batch: (request, decision index,
        #: its spawn or None for a bound warm agent).
        self.audited: list[tuple[Request, int, _Spawn | None]] = []
        for row in live:
            self._remember(
                LiveAgent(
                    row["agent_id"],
                    row["id"],
                    row["scaler"],
                    row["type"],
                    row["warm"],
                    row["bound_job_id"],
                    row["idempotency_key"],
                    row["scale_body"],
                )
            )

    def _remember(self, agent: LiveAgent) -> None:
        if agent.job_id:
            self.by_job[agent.job_id] = agent
        if agent.key:
            self.by_key[agent.key] = agent

    def decide(self, req: Request, match: tuple[ScalerInfo, LabelSetInfo] | None) -> None:
        """Decide ``req`` and keep its decision, filling in its request record (requests with a
        job id get one) from the decision. A request meeting a live agent of its job or key gets
        no record: the first request's stands. A KiCI scale-up whose agent id exists (and is not
        its own repeat) is an idempotency mismatch naming ``agentId``."""
        if (req.job_id or req.idempotency_key) and not req.warm:
            found = verdict(
                req.job_id,
                req.idempotency_key,
                req.body,
                self.by_job.get(req.job_id),
                self.by_key.get(req.idempotency_key),
            )
            if found is not None:
                self.decisions.append(self._answer_live(found))
                return
        if req.agent_id and (taken := self._agent_id_taken(req)) is not None:
            self.decisions.append(taken)
            return
        record = None
        if req.job_id:
            record = {
                "job_id": req.job_id,
                "run_id": req.run_id,
                "labels": list(req.labels),
                "resources": req.raw_resources,
                "cpus": 0.0,
                "memory_bytes": 0,
                "cap": "",
                "reason": "",
                "scaler_name": "",
                "agent_ref": "",
                "token_name": req.token_name,
            }
            self.records.append(record)
        decision = self._decide_one(req, match, record)
        self.decisions.append(decision)
        if (
            (req.job_id or req.idempotency_key)
            and not req.warm
            and decision.action
            in (
                ScaleOutcome.SPAWNING,
                ScaleOutcome.ASSIGNED,
            )
        ):
            spawn = self.spawns[-1] if decision.action == ScaleOutcome.SPAWNING else None
            if req.token_name:
                self.audited.append((req, len(self.decisions) - 1, spawn))
            self._remember(
                LiveAgent(
                    decision.agent or "",
                    decision.agent_pk,
                    decision.scaler or "",
                    decision.backend_type or "",
                    decision.action == ScaleOutcome.ASSIGNED,
                    req.job_id,
                    req.idempotency_key,
                    req.body,
                    spawn,
                )
            )
        if record is not None:
            record.update(
                outcome=decision.action,
                cap=decision.cap or "",
                reason=decision.reason,
                scaler_name=decision.scaler or "",
                agent_ref=decision.agent or "",
            )

    def _agent_id_taken(self, req: Request) -> ScaleDecision | None:
        """Idempotency-mismatch, field ``agentId``: an agent of the scale-up's id exists (a
        scale-up starts its agent once; a repeat of the one that started it was answered before)."""
        state = self.ids_taken.get(req.agent_id)
        if state is None:
            return None
        if state in LIVE_STATES:
            why = f"is live ({state}), asked for by another request than requestId {json_text(req.idempotency_key)}"
        else:
            why = f"has ended ({state})"
        return ScaleDecision(
            ScaleOutcome.IDEMPOTENCY_MISMATCH,
            agent=req.agent_id,
            field="agentId",
            reason=f"agent {req.agent_id} {why}: a scale-up starts its agent once",
        )

    def _answer_live(self, found: Verdict) -> ScaleDecision:
        """Replayed (the request repeats the one that asked for the live agent) or
        idempotency-mismatch naming the field; an agent this batch admits is named once written."""
        agent = found.agent
        if isinstance(agent.spawn, _Spawn):
            self.replays.append((len(self.decisions), agent.spawn))
        return ScaleDecision(
            ScaleOutcome.REPLAYED if found.field is None else ScaleOutcome.IDEMPOTENCY_MISMATCH,
            agent=agent.agent_id,
            agent_pk=agent.pk,
            scaler=agent.scaler,
            backend_type=agent.backend_type,
            warm=agent.warm,
            field=found.field,
            reason=found.message,
        )

    def _decide_one(
        self, req: Request, match: tuple[ScalerInfo, LabelSetInfo] | None, record: dict | None
    ) -> ScaleDecision:
        """The first decision of the steps, in order; the record gets the resolved requests."""
        if match is None:
            return _no_matching_label_set(req)
        info, ls = match
        decision = (
            _paused(info)
            or _cannot_run_job_image(req, info, ls)
            or _cannot_redeem_claim(req, info, ls)
            or _tools_missing(info)
            or self._in_backoff(info)
        )
        if decision is not None:
            return decision
        try:
            resolved = self.world.resolve(ls, None if req.warm else req.resources)
        except ValueError as exc:
            return _unresolvable(info, ls, exc)
        cpus, mem = float(resolved.requests.cpus), int(resolved.requests.mem_bytes)
        if record is not None:
            record["cpus"], record["memory_bytes"] = cpus, mem
        decision = self._assign_warm(req, info) or self._refuse_on_cap(req, info, cpus, mem)
        if decision is not None:
            return decision
        return self._admit(req, info, ls, resolved, cpus, mem, record)

    def _in_backoff(self, info: ScalerInfo) -> ScaleDecision | None:
        """Skipped: ``info`` is an event scaler in provision backoff."""
        reason = self.backoffs.get(info.name)
        if reason is None:
            return None
        return ScaleDecision(ScaleOutcome.SKIPPED, scaler=info.name, reason=reason, backend_type=info.type)

    def _assign_warm(self, req: Request, info: ScalerInfo) -> ScaleDecision | None:
        """Assigned: an idle warm agent of ``info`` that fits was bound to the job (never to a KiCI
        scale-up, whose agent has its own id)."""
        if req.warm or req.agent_id or not info.warm_pool_enabled or not self.idle:
            return None
        chosen = _pick_warm(self.cur, self.idle, self.taken, info, req)
        if chosen is None:
            return None
        return ScaleDecision(
            ScaleOutcome.ASSIGNED,
            agent=chosen["agent_id"],
            agent_pk=chosen["id"],
            scaler=info.name,
            backend_type=info.type,
            reason="idle warm agent",
        )

    def _refuse_on_cap(self, req: Request, info: ScalerInfo, cpus: float, mem: int) -> ScaleDecision | None:
        """Exceeds-cap (the request alone is larger than a resource cap: permanent) or at-capacity
        naming the first cap that refuses; counts the refusal."""
        world = self.world
        pool = world.pools.get(info.caps.machine_pool_id) if info.caps.machine_pool_id else None
        never = cap_exceeded_alone(world.glob, info.caps, pool, cpus, mem)
        cap = never or first_refusing_cap(self.usage, world.glob, info.caps, pool, cpus, mem)
        if cap is None:
            return None
        self._bump(REFUSALS, {"scaler": info.name, "cap": cap})
        if cap not in NOT_IN_ORCH_REFUSAL_GAUGE:
            self._bump(ORCH_REFUSALS, {})
        log.debug("scaler.cap exceeded: %s (scaler %s, job %s)", cap, info.name, req.job_id or "-")
        if never:  # permanent: retrying cannot help, so it is not "at capacity"
            return ScaleDecision(
                ScaleOutcome.EXCEEDS_CAP,
                scaler=info.name,
                cap=cap,
                backend_type=info.type,
                reason=_exceeds_cap_reason(cap, info, world, cpus, mem),
            )
        if cap in COUNT_CAPS:
            self.count_cap_refused = True
        return ScaleDecision(
            ScaleOutcome.AT_CAPACITY,
            scaler=info.name,
            cap=cap,
            reason=f"{cap} reached on scaler {info.name}",
            backend_type=info.type,
        )

    def _admit(
        self, req: Request, info: ScalerInfo, ls: LabelSetInfo, resolved, cpus: float, mem: int, record: dict | None
    ) -> ScaleDecision:
        """Spawning: book the admission into the usage snapshot and queue its agent for the write."""
        self.usage.admit(info.caps, cpus, mem)
        agent_id = req.agent_id or mint_agent_id(info.type)
        labels = req.agent_labels or ls.agent_labels
        if req.agent_id:
            self.ids_taken[agent_id] = AgentState.SPAWNING
        self.spawns.append(
            _Spawn(
                index=len(self.decisions),
                record=record,
                kind=info.type,
                agent_id=agent_id,
                scaler_id=info.pk,
                label_set_id=ls.pk,
                labels=labels,
                warm=req.warm,
                job="" if req.warm else req.job_id,
                run="" if req.warm else req.run_id,
                pool_id=info.caps.machine_pool_id,
                cpus=cpus,
                mem=mem,
                lcpus=float(resolved.limits.cpus),
                lmem=int(resolved.limits.mem_bytes),
                job_image=req.job_image.image if req.job_image else "",
                job_ref=req.job_image.credentials_ref if req.job_image else "",
                key="" if req.warm else req.idempotency_key,
                body=req.body,
                token=req.token_name,
                given_id=bool(req.agent_id),
            )
        )
        if req.warm:
            self._bump(WARM_SPAWNS, {"scaler": info.name})
        return ScaleDecision(
            ScaleOutcome.SPAWNING,
            agent=agent_id,
            scaler=info.name,
            backend_type=info.type,
            labels=tuple(labels),
        )

    def _bump(self, name: str, labels: dict, amount: float = 1.0) -> None:
        """Add ``amount`` to counter ``name{labels}`` (written with the batch)."""
        key = _counter_key(name, labels)
        prev = self.counters.get(key, (labels, 0.0))[1]
        self.counters[key] = (labels, prev + amount)

    def write(
        self,
        instance_id: str,
        now: datetime,
        *,
        commit: bool,
        guard: str | None,
        refused: tuple[list[str], list[str]] | None = None,
    ) -> BatchResult:
        """Give the new agents their spawn slots and ids, write the batch (see :func:`_write`) and
        return the decisions with the written agents' ids and pks."""
        usage, world, spawns, decisions = self.usage, self.world, self.spawns, self.decisions
        # Told once the batch is written: a batch decided from a held snapshot that moved is not.
        outrun = (
            (usage.total.reservations, usage.total.active)
            if self.count_cap_refused and usage.ledger_outruns_agents()
            else None
        )
        hand_on = _take_spawn_slots(spawns, world, usage)
        _dedupe_ids(spawns)
        hosts = {sp.scaler_id: scaler_host(world.scalers[sp.scaler_id]) for sp in spawns}
        audits = [
            audit_fields(
                AuditAction.API_SCALE,
                actor=req.token_name,
                actor_kind=ActorKind.TOKEN,
                scaler_name=decisions[index].scaler or "",
                agent_ref=spawn.agent_id if spawn is not None else decisions[index].agent or "",
                detail=f"{scale_asked(req.job_id, req.event)}: {decisions[index].action}",
            )
            for req, index, spawn in self.audited
        ]
        fold = usage.tally_rows >= ledger.FOLD_ROWS
        pks = _write(
            self.cur,
            now,
            instance_id,
            spawns,
            self.records,
            self.counters,
            fold=fold,
            commit=commit,
            guard=guard,
            world=world,
            refused=refused,
            audits=audits,
        )
        if outrun:
            log.warning("%s: %d reservations, %d active agents", LEDGER_WARNING, *outrun)
        admitted = []
        for index, sp in self.replays:
            decisions[index] = replace(decisions[index], agent=sp.agent_id, agent_pk=pks[sp.agent_id])
        for sp in spawns:
            pk = pks[sp.agent_id]
            decisions[sp.index] = replace(decisions[sp.index], agent=sp.agent_id, agent_pk=pk)
            admitted.append(
                Admitted(
                    pk,
                    sp.agent_id,
                    sp.scaler_id,
                    sp.label_set_id,
                    tuple(sp.labels),
                    sp.warm,
                    sp.job,
                    sp.run,
                    instance_id,
                    sp.job_image,
                    sp.job_ref,
                    spawn_job_id(sp.agent_id) if sp.slot else "",
                    sp.scaler_id in hand_on,
                    hosts[sp.scaler_id],
                )
            )
        return BatchResult(decisions=decisions, admitted=admitted)


def _no_matching_label_set(req: Request) -> ScaleDecision:
    """No-backend: no scaler's label set matches the request's labels."""
    log.warning("no scaler matches labels %s (job %s)", list(req.labels), req.job_id or "-")
    return ScaleDecision(ScaleOutcome.NO_BACKEND, reason="no-matching-label-set", labels=tuple(req.labels))


def _paused(info: ScalerInfo) -> ScaleDecision | None:
    """Paused: the scaler or its host is paused (``scalers.pauses``); nothing is spawned or bound."""
    if info.pause is None:
        return None
    return ScaleDecision(
        ScaleOutcome.PAUSED,
        scaler=info.name,
        backend_type=info.type,
        reason=pause_wording(info.pause),
        pause=info.pause,
    )


def _cannot_run_job_image(req: Request, info: ScalerInfo, ls: LabelSetInfo) -> ScaleDecision | None:
    """No-backend: the request names a job image and the matched label set cannot run one."""
    if not req.job_image or ls.runs_job_images:
        return None
    return ScaleDecision(
        ScaleOutcome.NO_BACKEND,
        scaler=info.name,
        backend_type=info.type,
        reason=f"label set [{ls.index}] of scaler {info.name} ({info.type}) cannot run a job image",
        labels=tuple(req.labels),
    )


def _cannot_redeem_claim(req: Request, info: ScalerInfo, ls: LabelSetInfo) -> ScaleDecision | None:
    """No-backend: a KiCI scale-up routed to a label set that does not run the real KiCI agent of
    its orchestrator (the console's own agent cannot redeem a claim code; another orchestrator's
    agent would dial where its rules do not let it)."""
    if req.event is None:
        return None
    wanted = str(req.event["orchestratorUrl"])
    if ls.kici_orchestrator_url == wanted:
        return None
    runs = f"the KiCI agent of {ls.kici_orchestrator_url}" if ls.kici_orchestrator_url else "the console's own agent"
    return ScaleDecision(
        ScaleOutcome.NO_BACKEND,
        scaler=info.name,
        backend_type=info.type,
        reason=(
            f"label set [{ls.index}] of scaler {info.name} ({info.type}) runs {runs}, not the KiCI agent of "
            f"orchestratorUrl {wanted}: a scale-up needs a kiciAgent label set of that orchestrator"
        ),
        labels=tuple(req.labels),
    )


def _agent_ids_taken(cur, agent_ids: list[str]) -> dict[str, str]:
    """``{agent id: state}`` of the agents of ``agent_ids`` that exist (read under the lock)."""
    if not agent_ids:
        return {}
    cur.execute("SELECT agent_id, state FROM agents_agent WHERE agent_id = ANY(%s::text[])", [agent_ids])
    return dict(cur.fetchall())


def _tools_missing(info: ScalerInfo) -> ScaleDecision | None:
    """Skipped: the scaler was not started because host tools it needs are missing."""
    if not info.tools_missing:
        return None
    return ScaleDecision(
        ScaleOutcome.SKIPPED,
        scaler=info.name,
        backend_type=info.type,
        reason=not_started_reason(info.name, info.tools_missing),
    )


def _unresolvable(info: ScalerInfo, ls: LabelSetInfo, exc: ValueError) -> ScaleDecision:
    """Skipped: the label set's resources do not resolve (``exc`` says why)."""
    return ScaleDecision(
        ScaleOutcome.SKIPPED,
        scaler=info.name,
        backend_type=info.type,
        reason=f"resources of {info.name} label set [{ls.index}] do not resolve: {exc}",
    )


def _take_spawn_slots(spawns: list[_Spawn], world: World, usage: Usage) -> set[int]:
    """Give the batch's new agents the free spawn slots of their scalers (``maxConcurrentSpawns``), in
    batch order, in this transaction, from the usage snapshot's counts; agents of a scaler that has
    agents waiting wait behind them. Returns the scalers that had free slots and waiting agents (the
    caller hands those on, oldest first, after the commit). Why no scaler row lock is needed:
    docs/admission.md ("maxConcurrentSpawns is a queue, not a refusal").
    """
    hand_on: set[int] = set()
    free: dict[int, int] = {}
    for sp in spawns:
        sp.slot = False
        if sp.scaler_id not in free:
            tally = usage.scaler(sp.scaler_id)
            room = max(0, world.scalers[sp.scaler_id].max_concurrent_spawns - tally.spawns_in_flight)
            free[sp.scaler_id] = 0 if tally.spawns_waiting else room
            if tally.spawns_waiting and room:
                hand_on.add(sp.scaler_id)
        if free[sp.scaler_id] > 0:
            sp.slot = True
            free[sp.scaler_id] -= 1
    return hand_on


def _pick_warm(cur, idle: list[dict], taken: set[int], info: ScalerInfo, req: Request) -> dict | None:
    """Bind the oldest idle warm agent of ``info`` that may serve ``req``."""
    job = {x.strip().lower() for x in req.labels}
    excluded = {x.strip().lower() for x in req.exclude}
    for cand in idle:
        if cand["id"] in taken or cand["scaler_id"] != info.pk:
            continue
        cls = info.label_set(cand["label_set_id"]) if cand["label_set_id"] else None
        if cls is None or any(g not in job for g in cls.gate):
            continue
        if not job <= cls.enriched or not excluded.isdisjoint(cls.enriched):
            continue
        shape = Shape(cand["cpus"], cand["memory_bytes"], cand["limit_cpus"], cand["limit_memory_bytes"])
        if not warm_agent_can_serve(req.resources, shape, job_image=req.job_image):
            continue
        taken.add(cand["id"])
        if ledger.bind_warm_agent(
            cur, cand["id"], req.job_id, req.run_id, req.idempotency_key, req.body, req.token_name
        ):
            return cand
    return None


def _dedupe_ids(spawns: list[_Spawn]) -> None:
    """Re-mint minted ids repeated within the batch or equal to a given one (ids already in the
    table are caught by the write; a given id is never repeated: :meth:`_BatchDecider.decide`)."""
    seen: set[str] = {sp.agent_id for sp in spawns if sp.given_id}
    for sp in spawns:
        if sp.given_id:
            continue
        while sp.agent_id in seen:
            sp.agent_id = mint_agent_id(sp.kind)
        seen.add(sp.agent_id)


def _write(
    cur,
    now,
    instance_id,
    spawns: list[_Spawn],
    records: list[dict],
    counters,
    *,
    fold: bool,
    commit: bool,
    guard: str | None,
    world: World,
    refused: tuple[list[str], list[str]] | None,
    audits: list[dict],
) -> dict[str, int]:
    for sp in spawns:
        if sp.record is not None:
            sp.record["agent_ref"] = sp.agent_id
    return ledger.write_batch(
        cur.connection,
        now=now,
        instance_id=instance_id,
        agents=[
            (sp.agent_id, sp.scaler_id, sp.label_set_id, list(sp.labels), sp.warm, sp.job, sp.run)
            + (sp.job_image, sp.job_ref, spawn_job_id(sp.agent_id) if sp.slot else "", sp.key, sp.body, sp.token)
            for sp in spawns
        ],
        reservations=[(sp.agent_id, sp.scaler_id, sp.pool_id, sp.cpus, sp.mem, sp.lcpus, sp.lmem) for sp in spawns],
        records=records,
        counters=counters,
        redispatch=(REDISPATCH, {"trigger": "sweep"}),
        fold=fold,
        commit=commit,
        guard=guard,
        hold=world if commit else None,
        refused=refused,
        audits=audits,
    )
