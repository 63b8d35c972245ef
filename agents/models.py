"""Agents, their single-use registration tokens, and their lifecycle events."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .choices import ACTIVE_STATES, LIVE_STATES, TERMINAL_STATES, AgentState, EventType

#: The unique indexes holding one live agent per job and per idempotency key (Agent.Meta).
LIVE_JOB_CONSTRAINT = "agent_one_live_per_job"
LIVE_KEY_CONSTRAINT = "agent_one_live_per_key"


class AgentQuerySet(models.QuerySet):
    def active(self):
        return self.filter(state__in=ACTIVE_STATES)


class Agent(models.Model):
    """One ephemeral CI agent: a container, a microVM, a host process or an external machine.

    ``agent_id`` is ``scaler-<type>-<8 hex>``. ``managed_id`` is the backend's own
    handle (container id, VM id, pid). ``host_access`` is the resolved allowlist stored at spawn
    time, because a self-heal has no orchestrator URL to re-derive it.
    """

    agent_id = models.CharField(max_length=100, unique=True)
    # Not indexed alone: the (scaler, state) index below leads with it.
    scaler = models.ForeignKey("scalers.Scaler", on_delete=models.PROTECT, related_name="agents", db_index=False)
    label_set = models.ForeignKey(
        "scalers.LabelSet", null=True, blank=True, on_delete=models.SET_NULL, related_name="agents"
    )
    state = models.CharField(max_length=20, choices=AgentState.choices, default=AgentState.SPAWNING, db_index=True)
    labels = models.JSONField(default=list, blank=True, help_text="full labels, incl. kici: auto labels")
    managed_id = models.CharField(max_length=200, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    bridge_port = models.CharField(
        max_length=15, blank=True, help_text="the bridge port (veth or TAP) its frames must arrive on to pass the guard"
    )
    host_access = models.JSONField(null=True, blank=True)
    host_access_explicit = models.BooleanField(default=False)
    warm = models.BooleanField(default=False)
    bound_job_id = models.CharField(max_length=200, blank=True)
    completed_job_id = models.CharField(
        max_length=200, blank=True, help_text="the last job the orchestrator reported complete on this agent"
    )
    run_id = models.CharField(max_length=200, blank=True)
    asked_by_token = models.CharField(
        max_length=64, blank=True, help_text="name of the API token whose /scale admitted or bound this agent"
    )
    idempotency_key = models.CharField(
        max_length=255, blank=True, help_text="the /scale Idempotency-Key header that asked for this agent; '' for none"
    )
    scale_body = models.JSONField(
        null=True,
        blank=True,
        help_text="the validated /scale body that asked for this agent (scalers.admission.idempotency); null for none",
    )
    owner_instance = models.CharField(max_length=200, blank=True)
    rq_job_id = models.CharField(max_length=100, blank=True)
    active_jobs = models.PositiveIntegerField(default=0)
    jobs_served = models.PositiveIntegerField(
        default=0, db_default=0, help_text="jobs the orchestrator reported complete on this agent"
    )
    failure_reason = models.TextField(blank=True)
    teardown_reason = models.CharField(
        max_length=200, blank=True, help_text="why its teardown began; a retried teardown keeps it as its reason"
    )
    backend_context = models.JSONField(default=dict, blank=True)
    job_image = models.CharField(
        max_length=500, blank=True, help_text="the job's own image (/scale container.image); '' = the label set's"
    )
    job_credentials_ref = models.CharField(
        max_length=200, blank=True, help_text="registry credential name for the job image (container.credentialsRef)"
    )
    lost = models.JSONField(
        default=dict,
        blank=True,
        help_text="the lost-agents sweep's mark while this agent is lost (agents.liveness.current_mark); {} otherwise",
    )
    hold = models.JSONField(
        default=dict,
        blank=True,
        db_default={},
        help_text="its debug hold (scalers.holds): who asked, why, how long, and once held what ended it; {} for none",
    )
    held_until = models.DateTimeField(
        null=True, blank=True, help_text="while held: when the sweeper tears its kept sandbox down"
    )
    spawn_trace = models.JSONField(
        default=dict,
        blank=True,
        db_default={},
        help_text="seconds from admission to each moment of its spawn (scalers.spawn_trace)",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    spawn_started_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = AgentQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        # The capacity sampler (scalers.samples) reads the agents registered since its last sample.
        indexes = [
            models.Index(fields=["scaler", "state"]),
            models.Index(fields=["registered_at"], name="agent_registered_at"),
            # No index on last_heartbeat: every heartbeat would then write all of the table's
            # indexes (no HOT update); /agents/?sort=last_heartbeat sorts narrow rows instead
            # (agents.listing.page_rows, docs/fleet-lists.md).
            # The lost agents (operations.attention, the nav badge of every page): a few rows, found
            # without reading the table. No heartbeat writes `lost`, so heartbeats stay HOT updates.
            models.Index(fields=["state"], condition=~Q(lost={}), name="agent_lost"),
        ]
        # One live agent per job and per idempotency key, whoever writes (scalers.admission.idempotency):
        # a batch that would make a second one fails, and is decided again knowing the first.
        constraints = [
            models.UniqueConstraint(
                fields=["bound_job_id"],
                condition=Q(state__in=LIVE_STATES) & ~Q(bound_job_id=""),
                name=LIVE_JOB_CONSTRAINT,
            ),
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(state__in=LIVE_STATES) & ~Q(idempotency_key=""),
                name=LIVE_KEY_CONSTRAINT,
            ),
        ]

    def __str__(self):
        return self.agent_id

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def is_ended(self) -> bool:
        """Destroyed or failed (``TERMINAL_STATES``): its sandbox is gone, it beats no more and its
        address was released."""
        return self.state in TERMINAL_STATES

    @property
    def current_ip(self) -> str | None:
        """The address the agent holds now: ``ip`` until it ended, then None. An ended agent's
        address was released and may be given to the next agent; ``ip`` keeps it as its last one."""
        return None if self.is_ended else self.ip


class AgentToken(models.Model):
    """A single-use ephemeral registration token; only its SHA-256 is stored."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, blank=True, help_text="first characters, for support")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"token {self.prefix}… for {self.agent_id}"


class ScalerEvent(models.Model):
    """One lifecycle event of an agent (sent as ``{agentId, eventType, detail, timestampMs}``)."""

    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    agent_ref = models.CharField(
        max_length=100, blank=True, db_index=True, help_text="agent id, kept if the agent row goes"
    )
    scaler_name = models.CharField(max_length=200, blank=True)
    type = models.CharField(max_length=40, choices=EventType.choices)
    detail = models.TextField(blank=True)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        # The provision backoff reads a scaler's last failures and registrations under the admission lock.
        indexes = [models.Index(fields=["scaler_name", "type", "created_at"], name="event_scaler_type_time")]

    def __str__(self):
        return f"{self.type} {self.agent_ref}"
