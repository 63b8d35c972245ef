"""Operation kinds, statuses and per-target outcomes (TextChoices, grouped as NetBox groups job states)."""

from django.db import models


class OperationKind(models.TextChoices):
    """What an operation does. Values are the names ``manage.py operations plan KIND`` accepts."""

    ORPHAN_CONTAINERS = "orphan-containers", "Reap orphan containers"
    ORPHAN_VMS = "orphan-vms", "Reap orphan VMs and chroots"
    STALE_ISOLATION_RULES = "stale-isolation-rules", "Reap stale isolation rules"
    STALE_RESERVATIONS = "stale-reservations", "Release stale reservations"
    LOST_AGENTS = "lost-agents", "Release lost agents"
    AGENT_DRAIN = "agent-drain", "Drain agents"
    AGENT_DESTROY = "agent-destroy", "Destroy agents"
    AGENT_HOLD = "agent-hold", "Hold agents' sandboxes for debugging"
    HOLD_RELEASE = "hold-release", "Release held agents"
    SCALER_RETIREMENT = "scaler-retirement", "Tear down a retired scaler"
    HOST_ACCESS_APPLY = "host-access-apply", "Apply a host-access change"
    CONFIG_RELOAD = "config-reload", "Reload scalers.yaml"
    PAUSE = "pause", "Pause a scaler or a host"
    RESUME = "resume", "Resume a scaler or a host"


class OperationStatus(models.TextChoices):
    PLANNED = "planned", "Planned"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


#: Waiting for a decision.
OPEN_STATUSES = (OperationStatus.PLANNED,)
#: Approved and handed to a worker, not finished yet.
ACTIVE_STATUSES = (OperationStatus.APPROVED, OperationStatus.RUNNING)
#: Nothing more will happen.
TERMINAL_STATUSES = (
    OperationStatus.REJECTED,
    OperationStatus.SUCCEEDED,
    OperationStatus.FAILED,
    OperationStatus.EXPIRED,
)

STATUS_COLOURS: dict[str, str] = {
    OperationStatus.PLANNED: "blue",
    OperationStatus.APPROVED: "blue",
    OperationStatus.RUNNING: "amber",
    OperationStatus.SUCCEEDED: "green",
    OperationStatus.FAILED: "red",
    OperationStatus.REJECTED: "grey",
    OperationStatus.EXPIRED: "grey",
}


class TargetOutcome(models.TextChoices):
    """What the run did with one target of the plan."""

    DONE = "done", "Done"
    SKIPPED = "skipped", "Skipped"
    FAILED = "failed", "Failed"


OUTCOME_COLOURS = {TargetOutcome.DONE: "green", TargetOutcome.SKIPPED: "amber", TargetOutcome.FAILED: "red"}


class AuditAction(models.TextChoices):
    """One line of the audit log: who moved which operation, from which status to which."""

    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    AUTO_APPROVED = "auto-approved", "Auto-approved by policy"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    STARTED = "started", "Started"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class RequestedVia(models.TextChoices):
    UI = "ui", "Web UI"
    CLI = "cli", "manage.py operations"
    SWEEP = "sweep", "Periodic sweep"
