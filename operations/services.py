"""Creating, approving, rejecting and expiring operations: the one path for the UI, the CLI and
sweeps. Every status change is a compare-and-swap that proceeds only if exactly one row changed,
and writes one :class:`~operations.models.AuditEntry` in the same transaction. A ``user`` of
``None`` is the system. Permissions and the order of the checks: docs/operations.md ("Roles and
permissions").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.utils import timezone

from agents.models import Agent
from audit.choices import ActorKind
from audit.records import record_audit
from scalers.models import LabelSet, Scaler

from .choices import AuditAction, OperationStatus, RequestedVia
from .kinds.base import Plan, PlanRefused, Scope, ScopeInvalid, jsonable, plan_digest
from .kinds.catalog import get_kind
from .models import AuditEntry, Operation, operation_progress
from .notify import schedule_approval_notice
from .queues import QueueNotConfigured, get_queue, queue_for_scaler, workers_listening

REQUEST_PERM = "operations.request_operation"
APPROVE_PERM = "operations.approve_operation"
VIEW_PERM = "operations.view_operation"


class OperationError(Exception):
    """A refusal the user should read (the message says what and why; nothing was changed)."""


#: Most characters of an approval's or rejection's note (after stripping).
DECISION_NOTE_MAX = 2000


class NoteTooLong(OperationError):
    """A decision's note over :data:`DECISION_NOTE_MAX` characters: refused, never cut."""


def checked_note(note: str) -> str:
    """``note`` stripped; raises :class:`NoteTooLong` naming the field when it is too long."""
    note = note.strip()
    if len(note) > DECISION_NOTE_MAX:
        raise NoteTooLong(f"note: at most {DECISION_NOTE_MAX} characters, got {len(note)}; nothing was decided")
    return note


class NothingToDo(OperationError):
    """The planner found no target; ``plan`` holds what it spared and its notes."""

    def __init__(self, kind: str, plan: Plan):
        self.plan = plan
        spared = f"; {len(plan.spared)} candidate(s) spared" if plan.spared else ""
        super().__init__(f"nothing to do for {kind}{spared}")


class PlanExpired(OperationError):
    """The plan is older than ``KICI_OPERATION_PLAN_TTL_SECONDS``; plan again."""


class InvalidTransition(OperationError):
    """The operation is not in a status that allows this action."""


class NoWorkerListening(OperationError):
    """No rq worker listens on the operation's queue, so it would never run."""


class WarningsNotConfirmed(OperationError):
    """The plan has warnings and the approver did not confirm having read them."""


class BulkRefused(OperationError):
    """One or more operations of a bulk approval cannot be approved now, so none was."""


class ApproverMustDiffer(PermissionDenied):
    """``KICI_REQUIRE_DISTINCT_APPROVER`` is on and the approver requested the operation."""


# --- scope ------------------------------------------------------------------------------------


def resolve_scope(kind: str, *, scaler=None, agent_ids=(), label_set=None, params: dict | None = None) -> Scope:
    """Build and validate a :class:`Scope` from names and ids as a form or the CLI gives them.

    ``scaler``: a Scaler or its name; ``agent_ids``: agent id strings; ``label_set``: a LabelSet or
    its primary key; ``params``: kind-specific inputs. The scaler is derived from the agents or the
    label set when not given; ``params`` keys the kind does not read (its ``params``) are dropped, so
    two requests for the same change share one scope. Raises :class:`ScopeInvalid` naming the field
    and the value.
    """
    if isinstance(scaler, str):
        name = scaler.strip()
        scaler = Scaler.objects.filter(name=name).first() if name else None
        if name and scaler is None:
            raise ScopeInvalid("scaler", f"no scaler named {name!r}")
    if label_set is not None and not isinstance(label_set, LabelSet):
        try:
            label_set = LabelSet.objects.select_related("scaler").get(pk=int(label_set))
        except (ValueError, TypeError, LabelSet.DoesNotExist):
            raise ScopeInvalid("label_set", f"no label set with id {label_set!r}") from None
    ids = tuple(dict.fromkeys(a.strip() for a in agent_ids if a and a.strip()))
    if ids:
        found = dict(Agent.objects.filter(agent_id__in=ids).values_list("agent_id", "scaler_id"))
        missing = [a for a in ids if a not in found]
        if missing:
            raise ScopeInvalid("agent", f"no agent with id {', '.join(map(repr, missing))}")
        scaler_ids = set(found.values())
        if len(scaler_ids) > 1:
            raise ScopeInvalid("agent", "the agents belong to different scalers; plan one operation per scaler")
        agent_scaler = Scaler.objects.get(pk=scaler_ids.pop())
        if scaler is not None and scaler.pk != agent_scaler.pk:
            raise ScopeInvalid("agent", f"the agents belong to scaler {agent_scaler.name!r}, not {scaler.name!r}")
        scaler = agent_scaler
    if label_set is not None:
        if scaler is not None and label_set.scaler_id != scaler.pk:
            raise ScopeInvalid(
                "label_set", f"label set [{label_set.index}] belongs to scaler {label_set.scaler.name!r}"
            )
        scaler = label_set.scaler
    operation_kind = get_kind(kind)
    scope = Scope(
        scaler=scaler,
        agent_ids=ids,
        label_set=label_set,
        params=jsonable({k: v for k, v in (params or {}).items() if k in operation_kind.params}),
    )
    operation_kind.validate_scope(scope)
    return scope


def scope_of(operation: Operation) -> Scope:
    """The scope an operation was planned for, rebuilt from its row (for the run's re-plan)."""
    return Scope(
        scaler=operation.scaler,
        agent_ids=tuple(operation.agent_ids),
        label_set=operation.label_set,
        params=operation.params or {},
    )


# --- audit and compare-and-swap ---------------------------------------------------------------


def _username(user) -> str:
    return user.get_username() if user is not None else "system"


def _audit(operation: Operation, user, action: str, from_status: str, to_status: str, detail: str = "") -> AuditEntry:
    """The operation's own audit line and the console-wide audit record (``audit``), in the caller's
    transaction: both commit with the status change or neither does."""
    actor = _username(user)
    record_audit(
        f"operation.{action}",
        actor=actor,
        actor_kind=ActorKind.USER if user is not None else ActorKind.SYSTEM,
        scaler_name=operation.scaler_name,
        operation_id=operation.pk,
        operation_kind=operation.kind,
        agent_ref=operation.agent_ids[0] if len(operation.agent_ids or []) == 1 else "",
        detail=f"{operation.get_kind_display()}: {detail}" if detail else operation.get_kind_display(),
    )
    return AuditEntry.objects.create(
        operation=operation,
        user=user if user is not None and user.pk else None,
        username=_username(user),
        action=action,
        from_status=from_status,
        to_status=to_status,
        detail=detail,
    )


def transition(
    operation: Operation,
    from_status: str,
    to_status: str,
    *,
    action: str,
    user=None,
    detail: str = "",
    where: dict | None = None,
    **fields,
) -> bool:
    """Move ``operation`` from ``from_status`` to ``to_status`` by compare-and-swap, setting ``fields``.

    Returns False (and changes nothing) when the row was no longer in ``from_status`` or did not match
    ``where``. On success writes the audit entry, updates the instance, and pushes the change live
    after commit.
    """
    with transaction.atomic():
        changed = Operation.objects.filter(pk=operation.pk, status=from_status, **(where or {})).update(
            status=to_status, **fields
        )
        if changed != 1:
            return False
        _audit(operation, user, action, from_status, to_status, detail)
    operation.status = to_status
    for name, value in fields.items():
        setattr(operation, name, value)
    transaction.on_commit(lambda: operation_progress.send(sender=Operation, operation_id=operation.pk, keys=[]))
    return True


# --- create -----------------------------------------------------------------------------------


def _require(user, perm: str) -> None:
    if user is None:
        return
    if not (user.is_active and user.has_perm(perm)):
        raise PermissionDenied(f"{_username(user)} lacks the permission {perm}")


def preview_operation(kind: str, scope: Scope | dict, user) -> tuple[str, Scope, Plan]:
    """Plan ``kind`` for ``scope`` and store nothing: a dry run (no operation, no badge, no
    approval notice). Returns ``(kind name, scope, plan)``; the plan has targets.

    ``scope`` is a :class:`Scope` or the keyword arguments of :func:`resolve_scope`. ``user`` needs
    ``operations.request_operation`` (None = the system). Raises PermissionDenied, ScopeInvalid
    (naming the field), :class:`NothingToDo` when the plan is empty, or PlanRefused when the
    planner refuses or cannot look (e.g. the runtime is unreachable).
    """
    _require(user, REQUEST_PERM)
    operation_kind = get_kind(kind)
    kind = operation_kind.name.value
    if not isinstance(scope, Scope):
        scope = resolve_scope(kind, **scope)
    else:
        operation_kind.validate_scope(scope)
    try:
        plan = operation_kind.plan(scope)
    except (ScopeInvalid, PlanRefused):
        raise
    except Exception as exc:  # a planner that cannot look plans nothing, and says why
        raise PlanRefused(f"the planner could not look ({type(exc).__name__}: {exc}); nothing was planned") from exc
    if not plan.targets:
        raise NothingToDo(kind, plan)
    return kind, scope, plan


def create_operation(
    kind: str, scope: Scope | dict, user, *, via: str = RequestedVia.UI, now: datetime | None = None
) -> Operation:
    """Plan ``kind`` for ``scope`` (:func:`preview_operation`, the same planning) and store it as a
    *planned* operation awaiting a decision.

    Returns the new operation, or the open identical one (same kind, scope and plan digest, not
    expired) with ``reused = True``. Raises what :func:`preview_operation` raises; nothing is
    stored in any of these cases.
    """
    kind, scope, plan = preview_operation(kind, scope, user)
    return store_plan(kind, scope, plan, user, via=via, now=now)


def stored_plan(kind: str, plan: Plan) -> tuple[list[dict], str]:
    """``plan``'s targets as an operation stores them (JSON) and the digest stored with them (the
    kind's volatile keys left out): what a preview shows and what its request compares."""
    targets = [jsonable(t.as_json()) for t in plan.targets]
    return targets, plan_digest(targets, get_kind(kind).volatile)


def store_plan(
    kind: str, scope: Scope, plan: Plan, user, *, via: str, now: datetime | None = None, notify: bool = True
) -> Operation:
    """Store an already computed non-empty plan (sweeps plan first to decide whether to store).

    ``notify``: a new operation is announced to ``KICI_NOTIFY_URL`` after the commit
    (``operations.notify``); a sweep whose policy approves it by itself passes False."""
    now = now or timezone.now()
    targets, digest = stored_plan(kind, plan)
    scope_key = scope.key(kind)
    with transaction.atomic():
        # Two sweeps (or a sweep and a person) planning the same scope at once must not both store.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 8))", [f"operations:{scope_key}"])
        existing = (
            Operation.objects.filter(
                kind=kind, scope_key=scope_key, plan_digest=digest, status=OperationStatus.PLANNED, expires_at__gt=now
            )
            .order_by("-created_at")
            .first()
        )
        if existing is not None:
            existing.reused = True
            return existing
        operation = Operation.objects.create(
            kind=kind,
            status=OperationStatus.PLANNED,
            scaler=scope.scaler,
            scaler_name=scope.scaler.name if scope.scaler else "",
            label_set=scope.label_set,
            agent_ids=list(scope.agent_ids),
            params=scope.params,
            host_queue=queue_for_scaler(scope.scaler),
            scope_key=scope_key,
            plan=targets,
            spared=[jsonable(s.as_json()) for s in plan.spared],
            notes=list(plan.notes),
            warnings=list(plan.warnings),
            plan_digest=digest,
            requested_via=via,
            requested_by=user if user is not None and user.pk else None,
            expires_at=now + timedelta(seconds=settings.KICI_OPERATION_PLAN_TTL_SECONDS),
        )
        Operation.objects.filter(pk=operation.pk).update(created_at=now)
        operation.created_at = now
        _audit(
            operation, user, AuditAction.REQUESTED, "", OperationStatus.PLANNED, f"{len(targets)} target(s) via {via}"
        )
        # A new row on the operation list's open pages (live.publish receives the signal).
        transaction.on_commit(lambda: operation_progress.send(sender=Operation, operation_id=operation.pk, keys=[]))
        if notify:
            schedule_approval_notice(operation)
    operation.reused = False
    return operation


# --- decide -----------------------------------------------------------------------------------


def _refuse_if_expired(operation: Operation, now: datetime) -> None:
    if operation.status == OperationStatus.PLANNED and operation.expires_at <= now:
        transition(
            operation,
            OperationStatus.PLANNED,
            OperationStatus.EXPIRED,
            action=AuditAction.EXPIRED,
            detail="expired when a decision was attempted",
        )
    if operation.status == OperationStatus.EXPIRED:
        raise PlanExpired(
            f"operation #{operation.pk} expired at {operation.expires_at:%Y-%m-%d %H:%M:%S %Z}: its evidence is "
            "too old to act on; plan it again"
        )


def _refuse_unless_planned(operation: Operation, verb: str) -> None:
    if operation.status != OperationStatus.PLANNED:
        raise InvalidTransition(
            f"operation #{operation.pk} has status {operation.status}: only a planned operation can be {verb}"
        )


def check_worker(operation: Operation) -> None:
    """Raise :class:`NoWorkerListening` unless an rq worker listens on the operation's queue."""
    try:
        count = workers_listening(operation.host_queue)
    except QueueNotConfigured as exc:
        raise NoWorkerListening(f"{exc}; nothing was approved") from None
    if count == 0:
        raise NoWorkerListening(
            f"no rq worker listens on queue {operation.host_queue}, so this operation would never run: "
            f"start one on that host (`manage.py rqworker {operation.host_queue}`); nothing was approved"
        )


def approve_operation(
    operation: Operation,
    user,
    *,
    note: str = "",
    now: datetime | None = None,
    require_worker: bool = True,
    enqueue: bool = True,
    warnings_confirmed: bool = False,
) -> Operation:
    """Approve a planned operation and enqueue its run on commit (queue ``operation.host_queue``). Raises,
    with nothing changed, PermissionDenied, ApproverMustDiffer, InvalidTransition, PlanExpired (marked
    expired), WarningsNotConfirmed (unless ``warnings_confirmed``) or NoWorkerListening
    (``require_worker=False`` skips it for ``--run-now``), checked in that order (docs/operations.md).
    ``enqueue=False`` approves without enqueueing (the caller runs it inline).
    """
    if user is None:
        raise PermissionDenied("an operation is approved by a person (or auto_approve for a policy)")
    note = checked_note(note)
    _require(user, APPROVE_PERM)
    operation.refresh_from_db()
    if settings.KICI_REQUIRE_DISTINCT_APPROVER and operation.requested_by_id == user.pk:
        raise ApproverMustDiffer(
            f"{_username(user)} requested operation #{operation.pk}; KICI_REQUIRE_DISTINCT_APPROVER needs "
            "another approver"
        )
    now = now or timezone.now()
    _refuse_if_expired(operation, now)
    _refuse_unless_planned(operation, "approved")
    if operation.warnings and not warnings_confirmed:
        raise WarningsNotConfirmed(unconfirmed_warnings_reason(operation) + "; nothing was approved")
    if require_worker:
        check_worker(operation)
    return _approve(operation, user, AuditAction.APPROVED, note, now, enqueue=enqueue, auto=False)


def unconfirmed_warnings_reason(operation: Operation) -> str:
    """Why ``operation`` is not approved without a confirmation of its warnings (one home for the
    text the pages, the CLI and the bulk approval show)."""
    n = len(operation.warnings)
    return (
        f"operation #{operation.pk} has {n} warning{'s' if n != 1 else ''}: it is approved only on its own, "
        "after confirming they were read"
    )


#: Most operations one bulk approval decides: its confirmation step lists every one with its targets.
BULK_APPROVE_LIMIT = 50


def check_bulk_selection(operations: list[Operation]) -> None:
    """ValueError naming the ``op`` field unless ``operations`` holds 1 to :data:`BULK_APPROVE_LIMIT`
    distinct operations."""
    if not operations:
        raise ValueError("op: select at least one operation")
    if len(operations) > BULK_APPROVE_LIMIT:
        raise ValueError(f"op: at most {BULK_APPROVE_LIMIT} operations at once, got {len(operations)}")
    if len({op.pk for op in operations}) != len(operations):
        raise ValueError("op: an operation is selected twice")


def approve_operations(operations: list[Operation], user, *, note: str = "") -> list[Operation]:
    """Approve every one of ``operations`` or none (the bulk confirmation of ``/operations/``): each is
    checked as :func:`approve_operation` does, then all are approved in one transaction, their runs
    enqueued on commit. Raises :class:`BulkRefused` naming each refused operation and why, also when
    one is lost to a race (every approval rolled back); ValueError from :func:`check_bulk_selection`;
    PermissionDenied without ``operations.approve_operation``.
    """
    check_bulk_selection(operations)
    if user is None:
        raise PermissionDenied("an operation is approved by a person (or auto_approve for a policy)")
    note = checked_note(note)
    _require(user, APPROVE_PERM)
    refused, listening = [], {}
    for operation in operations:
        operation.refresh_from_db()
        allowed, why_not = can_approve(user, operation)
        if allowed and operation.host_queue not in listening:
            try:
                check_worker(operation)
                listening[operation.host_queue] = ""
            except NoWorkerListening:
                listening[operation.host_queue] = f"no rq worker listens on queue {operation.host_queue}"
        why_not = why_not or (unconfirmed_warnings_reason(operation) if operation.warnings else "")
        why_not = why_not or listening.get(operation.host_queue, "")
        if why_not:
            refused.append(f"#{operation.pk}: {why_not}")
    if refused:
        raise BulkRefused(f"nothing was approved: {'; '.join(refused)}")
    now = timezone.now()
    try:
        with transaction.atomic():
            return [approve_operation(op, user, note=note, now=now, require_worker=False) for op in operations]
    except OperationError as exc:
        raise BulkRefused(f"nothing was approved: {exc}") from exc


def auto_approve(operation: Operation, *, now: datetime | None = None) -> Operation:
    """Approve by the kind's auto-approve policy (sweeps only); enqueued even with no worker yet.
    WarningsNotConfirmed when the plan has warnings: those are for a person to read."""
    now = now or timezone.now()
    _refuse_if_expired(operation, now)
    _refuse_unless_planned(operation, "approved")
    if operation.warnings:
        raise WarningsNotConfirmed(unconfirmed_warnings_reason(operation) + " by a person, never by a policy")
    return _approve(
        operation,
        None,
        AuditAction.AUTO_APPROVED,
        "approved by the auto-approve policy of this kind",
        now,
        enqueue=True,
        auto=True,
    )


def _approve(
    operation: Operation, user, action: str, note: str, now: datetime, *, enqueue: bool, auto: bool
) -> Operation:
    job_id = f"operation-{operation.pk}"
    with transaction.atomic():
        ok = transition(
            operation,
            OperationStatus.PLANNED,
            OperationStatus.APPROVED,
            action=action,
            user=user,
            detail=note,
            where={"expires_at__gt": now},
            approved_by=user,
            decided_at=now,
            decision_note=note,
            rq_job_id=job_id if enqueue else "",
            auto_approved=auto,
        )
        if not ok:
            operation.refresh_from_db()
            _refuse_if_expired(operation, now)
            _refuse_unless_planned(operation, "approved")
            raise InvalidTransition(f"operation #{operation.pk} changed while it was being approved; look again")
        if enqueue:
            get_queue(operation.host_queue).enqueue("operations.jobs.run_operation", operation.pk, job_id=job_id)
    return operation


def reject_operation(operation: Operation, user, *, note: str = "", now: datetime | None = None) -> Operation:
    """Reject a planned operation: it never runs. Needs ``operations.approve_operation``; raises
    PermissionDenied or InvalidTransition (e.g. already approved) with nothing changed."""
    if user is None:
        raise PermissionDenied("an operation is rejected by a person")
    note = checked_note(note)
    _require(user, APPROVE_PERM)
    operation.refresh_from_db()
    now = now or timezone.now()
    _refuse_unless_planned(operation, "rejected")
    ok = transition(
        operation,
        OperationStatus.PLANNED,
        OperationStatus.REJECTED,
        action=AuditAction.REJECTED,
        user=user,
        detail=note,
        rejected_by=user,
        decided_at=now,
        decision_note=note,
    )
    if not ok:
        operation.refresh_from_db()
        _refuse_unless_planned(operation, "rejected")
    return operation


def expire_due_operations(now: datetime | None = None) -> list[int]:
    """Mark every planned operation past its ``expires_at`` as expired; returns their ids."""
    now = now or timezone.now()
    expired = []
    for operation in Operation.objects.filter(status=OperationStatus.PLANNED, expires_at__lte=now):
        if transition(
            operation,
            OperationStatus.PLANNED,
            OperationStatus.EXPIRED,
            action=AuditAction.EXPIRED,
            detail="plan TTL elapsed",
        ):
            expired.append(operation.pk)
    return expired


def can_approve(user, operation: Operation) -> tuple[bool, str]:
    """Whether ``user`` may decide ``operation`` now, and if not why (for the page's buttons)."""
    if not (user and user.is_authenticated and user.has_perm(APPROVE_PERM)):
        return False, "you lack the permission to approve operations"
    if operation.status != OperationStatus.PLANNED:
        return False, f"the operation is {operation.status}"
    if operation.expires_at <= timezone.now():
        return False, "the plan has expired"
    if settings.KICI_REQUIRE_DISTINCT_APPROVER and operation.requested_by_id == user.pk:
        return False, "another approver must decide: you requested it"
    return True, ""
