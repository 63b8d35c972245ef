"""The Operation record and its audit log.

Every destructive action (a reap, a release, a drain, a destroy, a retirement, a rule change, a config
reload) is an :class:`Operation`: planned with the evidence for each target, previewed, decided by a
person (or by an explicit auto-approve policy), then run by an rq worker that re-plans and acts only on
targets whose evidence has not changed. Status moves only by compare-and-swap (see ``services``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import models
from django.dispatch import Signal

from .choices import (
    ACTIVE_STATUSES,
    STATUS_COLOURS,
    TERMINAL_STATUSES,
    AuditAction,
    OperationKind,
    OperationStatus,
    RequestedVia,
    TargetOutcome,
)

#: Sent when an operation was planned, its status changed, targets ``keys`` got outcomes, or log entries
#: ``[log_from:log_to]`` were added (kwargs ``operation_id``, ``keys``, ``log_from``, ``log_to``).
#: The ``live`` app pushes it to the operation's viewers; nothing here knows who listens.
operation_progress = Signal()


@dataclass(frozen=True)
class ShownStatus:
    """How an operation's status reads wherever it is shown (its page, the list, the CLI).

    ``name``: the status value, or ``nothing-done`` for a run that acted on no target; ``label``
    and ``colour``: its badge; ``detail``: the targets done and skipped when a run skipped some
    ("" otherwise)."""

    name: str
    label: str
    colour: str
    detail: str = ""

    @property
    def text(self) -> str:
        """``label: detail``, or the label alone."""
        return f"{self.label}: {self.detail}" if self.detail else self.label


class Operation(models.Model):
    """One planned destructive action.

    ``plan`` is a list of targets ``{"key", "action", "subject", "evidence": {...}}``; ``spared`` lists
    the candidates the planner looked at and left alone, each with a ``reason``. ``outcomes`` maps a
    target key to ``{"outcome": TargetOutcome, "detail": str, "at": iso8601}``. ``log`` is a list of
    ``{"at", "level", "message"}``. ``scope`` is what the planner was asked about (scaler, agent ids,
    label set, parameters); ``host_queue`` is the rq queue of the host that owns the targets.
    """

    kind = models.CharField(max_length=40, choices=OperationKind.choices, db_index=True)
    status = models.CharField(
        max_length=20, choices=OperationStatus.choices, default=OperationStatus.PLANNED, db_index=True
    )

    # Scope
    scaler = models.ForeignKey(
        "scalers.Scaler", null=True, blank=True, on_delete=models.SET_NULL, related_name="operations"
    )
    scaler_name = models.CharField(max_length=200, blank=True, help_text="kept if the scaler row goes")
    label_set = models.ForeignKey(
        "scalers.LabelSet", null=True, blank=True, on_delete=models.SET_NULL, related_name="operations"
    )
    agent_ids = models.JSONField(default=list, blank=True)
    params = models.JSONField(default=dict, blank=True, help_text="kind-specific inputs, e.g. the new hostAccess list")
    host_queue = models.CharField(max_length=200, help_text="rq queue host:<name> of the host owning the targets")
    scope_key = models.CharField(max_length=500, db_index=True, help_text="kind + scope, for duplicate detection")

    # Plan and results
    plan = models.JSONField(default=list, blank=True)
    spared = models.JSONField(default=list, blank=True)
    notes = models.JSONField(default=list, blank=True, help_text="planner remarks shown above the plan")
    warnings = models.JSONField(
        default=list,
        blank=True,
        help_text="what the plan may do that the requester did not mean; approving needs them confirmed",
    )
    plan_digest = models.CharField(max_length=64, db_index=True, help_text="sha256 of the plan's stable evidence")
    outcomes = models.JSONField(default=dict, blank=True)
    log = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    rq_job_id = models.CharField(max_length=100, blank=True)

    # People
    requested_via = models.CharField(max_length=10, choices=RequestedVia.choices, default=RequestedVia.UI)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rejected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    auto_approved = models.BooleanField(default=False)
    decision_note = models.TextField(blank=True)

    # Time
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    #: Not a column: ``operations.services.store_plan`` sets it to True on the open identical
    #: operation it returns instead of storing a new one.
    reused: bool = False

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [
            ("request_operation", "Can request (plan) an operation"),
            ("approve_operation", "Can approve or reject an operation"),
        ]
        indexes = [models.Index(fields=["status", "kind", "scope_key"])]

    def __str__(self):
        return f"#{self.pk} {self.get_kind_display()} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def scope_label(self) -> str:
        """A short human description of the scope, e.g. ``scaler ci · label set [0] · agents a, b``
        (a label set by its index in the scaler, as the scaler page and the editor name it)."""
        parts = []
        if self.scaler_name:
            parts.append(f"scaler {self.scaler_name}")
        if isinstance(self.params, dict) and self.params.get("host"):  # a pause or resume of a host
            parts.append(f"host {self.params['host']}")
        if self.label_set is not None:
            parts.append(f"label set [{self.label_set.index}]")
        if self.agent_ids:
            parts.append("agents " + ", ".join(self.agent_ids))
        return " · ".join(parts) or "this host"

    def counts(self) -> dict[str, int]:
        """Targets per outcome, plus ``pending`` and ``total`` (for the progress bar)."""
        result = {o.value: 0 for o in TargetOutcome}
        for entry in (self.outcomes or {}).values():
            name = entry.get("outcome")
            result[name if name in result else TargetOutcome.FAILED.value] += 1
        result["total"] = len(self.plan)
        result["pending"] = max(0, result["total"] - sum(result[o.value] for o in TargetOutcome))
        return result

    def shown_status(self) -> ShownStatus:
        """The status as people read it. A run succeeds when no target failed, skipped ones
        included, so a succeeded one that skipped targets says how many: "Succeeded: 2 done,
        1 skipped", and one that skipped them all reads "Nothing done: 3 skipped", never
        "Succeeded"."""
        shown = ShownStatus(self.status, self.get_status_display(), STATUS_COLOURS.get(self.status, "grey"))
        if self.status != OperationStatus.SUCCEEDED:
            return shown
        counts = self.counts()
        done, skipped = counts[TargetOutcome.DONE.value], counts[TargetOutcome.SKIPPED.value]
        if not skipped:
            return shown
        if not done:
            return ShownStatus("nothing-done", "Nothing done", "grey", f"{skipped} skipped")
        return ShownStatus(shown.name, shown.label, shown.colour, f"{done} done, {skipped} skipped")


def target_dom_id(key: str) -> str:
    """A DOM id for one target row, stable between the page render and a WebSocket push."""
    import hashlib

    return "target-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class AuditEntry(models.Model):
    """One state change of an operation: who, when, from which status to which, and why."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="audit")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(
        max_length=150, blank=True, help_text="kept if the user goes; 'system' for sweeps and workers"
    )
    action = models.CharField(max_length=20, choices=AuditAction.choices)
    from_status = models.CharField(max_length=20, choices=OperationStatus.choices, blank=True)
    to_status = models.CharField(max_length=20, choices=OperationStatus.choices)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name_plural = "audit entries"

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username or 'system'} {self.action} #{self.operation_id}"


class SweepState(models.Model):
    """When each periodic sweep (kind + scope) last ran, so a sweep runs once per interval."""

    sweep_key = models.CharField(max_length=500, unique=True)
    last_run_at = models.DateTimeField()
    last_result = models.TextField(blank=True)

    def __str__(self):
        return f"{self.sweep_key} @ {self.last_run_at:%H:%M:%S}"


class Finding(models.Model):
    """One thing a detection found that a reap would act on, before anyone planned anything: an
    orphan container or VM, a stale isolation rule set (``operations.findings``). Kept while each
    round finds it again (``last_seen_at``), deleted the round it is gone; its ``evidence`` is the
    plan target's. Storing a finding plans, approves and notifies nothing."""

    kind = models.CharField(max_length=40, choices=OperationKind.choices)
    scaler = models.ForeignKey("scalers.Scaler", on_delete=models.CASCADE, related_name="findings")
    key = models.CharField(max_length=500, help_text="the plan target's key, e.g. container:<id>")
    subject = models.CharField(max_length=500)
    action = models.CharField(max_length=200, help_text="what a reap would do to it")
    evidence = models.JSONField(default=dict, blank=True)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    #: Not a column: the evidence as ``(label, value)`` pairs, set by the page that shows it.
    evidence_items: list[tuple[str, str]] = []

    class Meta:
        ordering = ["kind", "first_seen_at", "id"]
        constraints = [models.UniqueConstraint(fields=["kind", "scaler", "key"], name="finding_unique_target")]

    def __str__(self):
        return f"{self.kind} {self.subject}"
