"""Periodic sweeps: plan each swept kind for each of its scopes and store what they find as planned
operations. Called by every host's sweeper: scopes planned from a host's own runtime only by that
host's, the global ones, plan expiry and the check of lost runs only by the leader. At most once
per policy interval, nothing for nothing found, no duplicate of an open plan, no plan of a scope
being acted on; auto-approval by policy. The rules: docs/operations.md ("Periodic sweeps").
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.utils import timezone

from scalers.models import this_host

from .choices import AuditAction, OperationStatus, RequestedVia
from .kinds.base import Kind, Plan, Scope
from .kinds.catalog import all_kinds
from .models import Operation, SweepState
from .policy import SweepPolicy, sweep_policy
from .queues import QueueNotConfigured, get_queue
from .services import auto_approve, expire_due_operations, store_plan, transition

log = logging.getLogger(__name__)

#: an approved operation whose job has not started within this many seconds is checked with rq
LOST_JOB_GRACE_SECONDS = 60


def run_periodic_sweeps(
    now: datetime | None = None, *, host_scopes: bool = True, global_scopes: bool = True
) -> list[Operation]:
    """Run every due sweep; return the operations created (or auto-approved) by this call.

    ``host_scopes``: the scopes of this host's scalers that are planned by their host
    (``Kind.planned_by_host``); ``global_scopes``: the others, with the expiry of due plans and
    the check of lost runs (the leader's). Never raises for one failing scope: the error is
    logged and stored in ``SweepState.last_result`` and the other sweeps go on.
    """
    now = now or timezone.now()
    if global_scopes:
        expire_due_operations(now)
        fail_lost_runs(now)
    here = this_host()
    created: list[Operation] = []
    for kind in all_kinds():
        if not kind.swept:
            continue
        policy = sweep_policy(kind.name)
        if not policy.enabled:
            continue
        for scope in _sweep_scopes(kind):
            if not _swept_here(kind, scope, here, host_scopes=host_scopes, global_scopes=global_scopes):
                continue
            operation = _sweep(kind, scope, policy, now)
            if operation is not None:
                created.append(operation)
    return created


def _sweep_scopes(kind: Kind) -> list[Scope]:
    """``kind``'s scopes to sweep; none (logged) when they cannot be listed."""
    try:
        return kind.sweep_scopes()
    except Exception as exc:
        log.warning("sweep %s: could not list scopes: %s", kind.name, exc, exc_info=True)
        return []


def _swept_here(kind: Kind, scope: Scope, here: str, *, host_scopes: bool, global_scopes: bool) -> bool:
    """Whether this call sweeps ``scope``: a scope planned by its host only on its scaler's host
    (and with ``host_scopes``), any other only with ``global_scopes``."""
    if kind.planned_by_host(scope):
        return host_scopes and scope.scaler.host == here
    return global_scopes


def _sweep(kind: Kind, scope: Scope, policy: SweepPolicy, now: datetime) -> Operation | None:
    """Plan one (kind, scope) when its interval has passed and no operation of it is running;
    store what it found and record the result in ``SweepState``. Returns the operation created
    (or auto-approved), None otherwise; an error is logged and recorded, never raised."""
    key = scope.key(kind.name)
    state = SweepState.objects.filter(sweep_key=key).first()
    if state and state.last_run_at + timedelta(seconds=policy.interval_seconds) > now:
        return None
    busy = Operation.objects.filter(kind=kind.name, scope_key=key, status=OperationStatus.RUNNING).first()
    if busy is not None:
        # Its targets are being acted on: a plan now would list them again.
        result = f"operation #{busy.pk} of this scope is running; planned again once it ends"
        SweepState.objects.update_or_create(sweep_key=key, defaults={"last_run_at": now, "last_result": result})
        return None
    created = None
    try:
        plan = kind.plan(scope)
        operation, created, result = _store_found(kind, scope, plan, policy, now)
        kind.observe(scope, plan, operation)
    except Exception as exc:  # one scope failing must not stop the others
        result = f"error: {type(exc).__name__}: {exc}"
        log.warning("sweep %s failed: %s", key, exc, exc_info=True)
    SweepState.objects.update_or_create(sweep_key=key, defaults={"last_run_at": now, "last_result": result[:2000]})
    return created


def _store_found(
    kind: Kind, scope: Scope, plan: Plan, policy: SweepPolicy, now: datetime
) -> tuple[Operation | None, Operation | None, str]:
    """Store a plan with targets as a planned operation (approved at once when the policy or the
    kind says so and it has no warnings). Returns (the operation stored or reused, the operation
    created, the sweep's result line)."""
    if not plan.targets:
        return None, None, f"nothing found ({len(plan.spared)} spared)"
    # A plan with warnings waits for a person whatever the policy says.
    auto = (policy.auto_approve or kind.auto_approves(scope)) and not plan.warnings
    operation = store_plan(kind.name, scope, plan, None, via=RequestedVia.SWEEP, now=now, notify=not auto)
    if operation.reused:
        return operation, None, f"{len(plan.targets)} target(s); identical operation #{operation.pk} still open"
    result = f"{len(plan.targets)} target(s): operation #{operation.pk}"
    if auto:
        auto_approve(operation, now=now)
        result += " (auto-approved)"
    return operation, operation, result


def fail_lost_runs(now: datetime | None = None) -> list[int]:
    """Mark approved/running operations whose rq job failed, was stopped or vanished as failed."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job, JobStatus

    now = now or timezone.now()
    lost = []
    grace = now - timedelta(seconds=LOST_JOB_GRACE_SECONDS)
    candidates = Operation.objects.filter(
        status__in=[OperationStatus.APPROVED, OperationStatus.RUNNING], decided_at__lt=grace
    ).exclude(rq_job_id="")
    for operation in candidates:
        try:
            queue = get_queue(operation.host_queue)
            job = Job.fetch(operation.rq_job_id, connection=queue.connection, serializer=queue.serializer)
            status = job.get_status(refresh=True)
        except NoSuchJobError:
            status = None
        except (QueueNotConfigured, Exception) as exc:  # noqa: BLE001 - cannot tell: leave it
            log.debug("cannot check job of operation %s: %s", operation.pk, exc)
            continue
        if status is None or status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            if status is None and operation.status == OperationStatus.APPROVED:
                reason = f"its rq job {operation.rq_job_id} vanished before it started"
            else:
                shown = status.value if status else "gone"
                reason = f"its rq job {operation.rq_job_id} is {shown} (worker killed or timed out)"
            if transition(
                operation,
                operation.status,
                OperationStatus.FAILED,
                action=AuditAction.FAILED,
                detail=reason,
                finished_at=now,
                error=reason,
            ):
                lost.append(operation.pk)
    return lost
