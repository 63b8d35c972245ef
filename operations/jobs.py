"""The rq job that runs an approved operation.

The run re-plans with the kind's one planning function and acts only on approved targets still in
the fresh plan with the same evidence; every other target is skipped with the reason (a container
that registered since the preview is never reaped). Outcomes and log lines are written in batches
(at most every ``FLUSH_SECONDS``) and pushed to the operation's page as they are written.
"""

from __future__ import annotations

import json
import logging
import time
import traceback

from django.db import connection, transaction
from django.utils import timezone

from audit.choices import AuditAction as AuditRecordAction
from audit.records import record_audit

from .choices import AuditAction, OperationStatus, TargetOutcome
from .kinds.base import recheck
from .kinds.catalog import get_kind
from .models import Operation, operation_progress
from .services import scope_of, transition

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.25  # seconds between progress writes (and pushes) for a small plan
FLUSH_SECONDS_MAX = 2.0  # ... growing with the plan (1 ms per target) up to this, to bound the writes


class Progress:
    """Collects per-target outcomes and log lines of one run; writes and pushes them in batches."""

    def __init__(self, operation: Operation):
        self.operation = operation
        self.operation_id = operation.pk
        self.outcomes: dict = dict(operation.outcomes or {})
        self.entries: list = list(operation.log or [])
        self._dirty_keys: list[str] = []
        self._log_from: int | None = None
        self._last_flush = 0.0
        self.interval = min(FLUSH_SECONDS_MAX, max(FLUSH_SECONDS, len(operation.plan or []) / 1000))
        self.subjects = {t["key"]: t.get("subject", t["key"]) for t in operation.plan or []}

    def report(self, key: str, outcome: TargetOutcome | str, detail: str = "") -> None:
        """Record what happened to target ``key`` (first report wins: a target is acted on once)."""
        if key in self.outcomes:
            return
        self.outcomes[key] = {
            "outcome": TargetOutcome(outcome).value,
            "detail": detail,
            "at": timezone.now().isoformat(),
        }
        self._dirty_keys.append(key)
        self._maybe_flush()

    def log(self, message: str, level: str = "info") -> None:
        if self._log_from is None:
            self._log_from = len(self.entries)
        self.entries.append({"at": timezone.now().isoformat(), "level": level, "message": message})
        getattr(log, "warning" if level == "warning" else "error" if level == "error" else "info")(
            "operation %s: %s", self.operation.pk, message
        )
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Write the new outcomes and log lines (only the delta crosses the wire: ``jsonb ||``), then
        push them to the operation's viewers."""
        if not self._dirty_keys and self._log_from is None:
            return
        delta = {k: self.outcomes[k] for k in self._dirty_keys}
        new_log = self.entries[self._log_from :] if self._log_from is not None else []
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Operation._meta.db_table} SET outcomes = outcomes || %s::jsonb, log = log || %s::jsonb "
                "WHERE id = %s",
                [json.dumps(delta), json.dumps(new_log), self.operation.pk],
            )
            self._audit_targets(delta)
        self.operation.outcomes, self.operation.log = self.outcomes, self.entries
        keys, log_from = self._dirty_keys, self._log_from
        self._dirty_keys, self._log_from = [], None
        self._last_flush = time.monotonic()
        operation_progress.send(
            sender=Operation,
            operation_id=self.operation.pk,
            keys=keys,
            log_from=log_from,
            log_to=len(self.entries) if log_from is not None else None,
        )

    def _audit_targets(self, delta: dict) -> None:
        """An audit record per target done or failed in ``delta`` (an orphan removed, an agent
        destroyed, rules rewritten); skipped targets changed nothing and are left to the operation."""
        actions = {
            TargetOutcome.DONE.value: AuditRecordAction.TARGET_DONE,
            TargetOutcome.FAILED.value: AuditRecordAction.TARGET_FAILED,
        }
        for key, entry in delta.items():
            action = actions.get(entry["outcome"])
            if action is None:
                continue
            subject = self.subjects.get(key, key)
            record_audit(
                action,
                scaler_name=self.operation.scaler_name,
                operation_id=self.operation.pk,
                operation_kind=self.operation.kind,
                agent_ref=key.removeprefix("agent:") if key.startswith("agent:") else "",
                detail=f"{subject}: {entry['detail']}" if entry.get("detail") else subject,
            )


def run_operation(operation_pk: int) -> str:
    """Run approved operation ``operation_pk``: approved → running → succeeded | failed.

    Returns a one-line summary (stored by rq as the job result): the status as people read it
    (``Operation.shown_status``: ``nothing-done`` when every target was skipped) and the counts. An
    operation that is not approved (rejected, expired, already running or run) is left alone. The
    operation fails when the re-plan raises or any target failed; skipped targets do not fail it.
    """
    operation = Operation.objects.select_related("scaler", "label_set").filter(pk=operation_pk).first()
    if operation is None:  # a job left in Redis by another database (or a deleted operation)
        log.warning("rq job for operation #%s: no such operation in this database; dropped", operation_pk)
        return f"operation #{operation_pk} does not exist; nothing run"
    if not transition(
        operation,
        OperationStatus.APPROVED,
        OperationStatus.RUNNING,
        action=AuditAction.STARTED,
        started_at=timezone.now(),
    ):
        operation.refresh_from_db()
        return f"operation #{operation_pk} is {operation.status}; nothing run"
    progress = Progress(operation)
    error = ""
    try:
        operation_kind = get_kind(operation.kind)
        scope = scope_of(operation)
        progress.log(f"re-planning {operation.get_kind_display().lower()} to re-check {len(operation.plan)} target(s)")
        fresh = operation_kind.plan(scope)
        for note in fresh.notes:
            progress.log(note)
        checked = recheck(operation.plan, fresh, operation_kind.volatile)
        for key, reason in checked.skipped:
            progress.report(key, TargetOutcome.SKIPPED, reason)
        matched = checked.matched
        if operation_kind.atomic and checked.skipped and matched:
            for target in matched:
                progress.report(
                    target.key,
                    TargetOutcome.SKIPPED,
                    "not applied: this plan is applied whole and part of it changed since the preview",
                )
            matched = []
        progress.log(f"{len(matched)} target(s) unchanged since the preview, {len(checked.skipped)} skipped")
        if matched:
            operation_kind.act(progress, scope, fresh, matched)
        for target in matched:
            progress.report(target.key, TargetOutcome.FAILED, "no result was reported for this target")
    except Exception as exc:  # noqa: BLE001 - any failure ends the run as failed, with the reason
        error = f"{type(exc).__name__}: {exc}"
        progress.log(f"run failed: {error}", "error")
        log.error("operation %s failed:\n%s", operation_pk, traceback.format_exc())
        for target in operation.plan:
            progress.report(target["key"], TargetOutcome.SKIPPED, f"not attempted: the run failed ({error})")
    failed = sum(1 for o in progress.outcomes.values() if o["outcome"] == TargetOutcome.FAILED)
    done = sum(1 for o in progress.outcomes.values() if o["outcome"] == TargetOutcome.DONE)
    skipped = sum(1 for o in progress.outcomes.values() if o["outcome"] == TargetOutcome.SKIPPED)
    summary = f"{done} done, {skipped} skipped, {failed} failed"
    progress.log(f"finished: {summary}", "error" if (error or failed) else "info")
    progress.flush()
    final = OperationStatus.FAILED if (error or failed) else OperationStatus.SUCCEEDED
    moved = transition(
        operation,
        OperationStatus.RUNNING,
        final,
        action=AuditAction.FAILED if final == OperationStatus.FAILED else AuditAction.SUCCEEDED,
        detail=error or summary,
        finished_at=timezone.now(),
        error=error or (f"{failed} target(s) failed" if failed else ""),
    )
    if not moved:  # ended meanwhile by someone else (the sweep of lost runs): say what it is now
        operation.refresh_from_db()
    return f"operation #{operation_pk} {operation.shown_status().name}: {summary}"
