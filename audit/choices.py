"""What an audit record says happened (``AuditRecord.action``) and who did it (``actor_kind``)."""

from django.db import models


class AuditAction(models.TextChoices):
    """One kind of audited change. ``operation.*`` follow an operation's status (its kind, such as
    ``host-access-apply`` or ``config-reload``, is ``AuditRecord.operation_kind``); ``target.*`` is
    what a run did to one target of its plan (an orphan container removed, an agent destroyed);
    ``api.*`` are the orchestrator's calls that changed something, by token; ``config.*`` are the
    values a ``scalers.yaml`` import changed; ``login.*`` and ``logout`` are the sign-ins; ``shell.*`` an
    approver's shell into an agent's container (``live.shell``), opened and closed."""

    OPERATION_REQUESTED = "operation.requested", "operation requested"
    OPERATION_APPROVED = "operation.approved", "operation approved"
    OPERATION_AUTO_APPROVED = "operation.auto-approved", "operation auto-approved by policy"
    OPERATION_REJECTED = "operation.rejected", "operation rejected"
    OPERATION_EXPIRED = "operation.expired", "operation expired"
    OPERATION_STARTED = "operation.started", "operation started"
    OPERATION_SUCCEEDED = "operation.succeeded", "operation succeeded"
    OPERATION_FAILED = "operation.failed", "operation failed"
    TARGET_DONE = "target.done", "operation target done"
    TARGET_FAILED = "target.failed", "operation target failed"
    API_SCALE = "api.scale", "scale call admitted a job"
    API_JOB_COMPLETE = "api.job-complete", "job-complete call"
    API_RELEASE = "api.release", "release call"
    CONFIG_CHANGED = "config.changed", "configuration changed by an import"
    LOGIN = "login.succeeded", "signed in"
    LOGIN_FAILED = "login.failed", "sign-in refused"
    LOCKED_OUT = "login.locked-out", "locked out after failed sign-ins"
    LOGOUT = "logout", "signed out"
    SHELL_OPENED = "shell.opened", "shell into an agent opened"
    SHELL_CLOSED = "shell.closed", "shell into an agent closed"


class ActorKind(models.TextChoices):
    USER = "user", "person"
    TOKEN = "token", "API token"
    SYSTEM = "system", "the console"


#: Badge class of an action on the audit page; an action not listed is blue.
ACTION_BADGES = {
    AuditAction.OPERATION_APPROVED: "b-green",
    AuditAction.OPERATION_AUTO_APPROVED: "b-green",
    AuditAction.OPERATION_SUCCEEDED: "b-green",
    AuditAction.TARGET_DONE: "b-green",
    AuditAction.LOGIN: "b-green",
    AuditAction.OPERATION_REJECTED: "b-grey",
    AuditAction.OPERATION_EXPIRED: "b-grey",
    AuditAction.LOGOUT: "b-grey",
    AuditAction.OPERATION_FAILED: "b-red",
    AuditAction.TARGET_FAILED: "b-red",
    AuditAction.LOGIN_FAILED: "b-red",
    AuditAction.LOCKED_OUT: "b-red",
    AuditAction.CONFIG_CHANGED: "b-amber",
    AuditAction.API_RELEASE: "b-amber",
    AuditAction.SHELL_OPENED: "b-amber",
    AuditAction.SHELL_CLOSED: "b-grey",
}
