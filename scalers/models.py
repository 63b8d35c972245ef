"""Scalers, label sets, caps and the reservation ledger.

The reservation rows ARE the admitted set: every count cap is derived from them, never from a
counter kept beside them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models

from .choices import ScalerType


class ConfigState(models.Model):
    """The global part of the imported ``scalers.yaml`` (a singleton row, pk=1).

    Admission locks this row to serialise the decision across every console process that
    shares the database (see ``scalers.admission``).
    """

    global_max_agents = models.PositiveIntegerField(default=50)
    global_max_cpu = models.FloatField(null=True, blank=True)
    global_max_memory_bytes = models.BigIntegerField(null=True, blank=True)
    defaults = models.JSONField(default=dict, blank=True, help_text="defaults.resources as in scalers.yaml")
    firecracker = models.JSONField(default=dict, blank=True, help_text="the top-level firecracker network block")
    source = models.CharField(max_length=500, blank=True)
    imported_at = models.DateTimeField(null=True, blank=True)
    raw = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "config state"

    def __str__(self):
        return f"config from {self.source or '(none)'}"

    @classmethod
    def load(cls) -> ConfigState:
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj


class ConfigGeneration(models.Model):
    """A token that changes with every write to the rows admission routes by (a singleton, pk=1).

    Statement triggers on ``scalers_scaler``, ``scalers_labelset``, ``scalers_machinepool`` and
    ``scalers_pause`` (migration ``scalers.0002_squashed_0021_held_counts_active``) set ``token`` to a
    fresh random UUID in the writing transaction, so it commits with the change and is never
    reused, even after a TRUNCATE or a restored backup. Admission keys its cached routing table by
    it instead of hashing every row on each batch (``scalers.admission.ledger``).
    """

    token = models.CharField(max_length=36, default="")

    class Meta:
        verbose_name = "config generation"

    def __str__(self):
        return f"config generation {self.token or '(none)'}"


class MachinePool(models.Model):
    """A resource cap shared by several scalers on one machine."""

    name = models.CharField(max_length=200, unique=True)
    max_cpu = models.FloatField(null=True, blank=True)
    max_memory_bytes = models.BigIntegerField(null=True, blank=True)

    def __str__(self):
        return self.name


def this_host() -> str:
    """The host this process runs on (``settings.KICI_HOST_NAME``): the owner of the scalers it imports."""
    return settings.KICI_HOST_NAME


class ScalerQuerySet(models.QuerySet):
    def on_this_host(self) -> ScalerQuerySet:
        """The scalers of this host (:func:`this_host`): the ones its sweeper sweeps and its workers run."""
        return self.filter(host=this_host())


class Scaler(models.Model):
    """One ``scalers[]`` entry. Removed entries are kept, marked retiring.

    ``host`` is the ``KICI_HOST_NAME`` of the console that imported it: its spawns, teardowns and
    operations run on that host's queue (``scalers.hosts``) and only that host's sweeper sweeps
    its sandboxes (docs/multi-host.md). Names are unique across hosts."""

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(
        max_length=200, default=this_host, db_index=True, help_text="KICI_HOST_NAME of the console that imported it"
    )
    type = models.CharField(max_length=20, choices=ScalerType.choices)
    max_agents = models.PositiveIntegerField()
    max_concurrent_spawns = models.PositiveIntegerField(default=8)
    max_cpu = models.FloatField(null=True, blank=True, help_text="resourceCap.maxCpu")
    max_memory_bytes = models.BigIntegerField(null=True, blank=True, help_text="resourceCap.maxMemory in bytes")
    machine_pool = models.ForeignKey(
        MachinePool, null=True, blank=True, on_delete=models.SET_NULL, related_name="scalers"
    )
    mandatory_labels = models.JSONField(default=list, blank=True)
    roles = models.JSONField(null=True, blank=True, help_text="null = all roles")
    orchestrator_url = models.CharField(max_length=500, blank=True)
    warm_pool_enabled = models.BooleanField(default=False)
    warm_pool_size = models.PositiveIntegerField(default=0)
    warm_pool_idle_timeout_seconds = models.FloatField(default=300)
    config = models.JSONField(default=dict, blank=True, help_text="the whole entry as imported")
    retiring = models.BooleanField(default=False)
    retiring_since = models.DateTimeField(null=True, blank=True)
    host_tools_missing = models.JSONField(
        default=list,
        blank=True,
        help_text="host tools the sweeper found missing (scalers.backends.tools); non-empty = not started",
    )
    host_error = models.TextField(
        blank=True, help_text="why the sweeper's last ensure_host_ready failed; empty when it succeeded"
    )
    host_checked_at = models.DateTimeField(null=True, blank=True, help_text="when the sweeper last readied the host")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ScalerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Pause(models.Model):
    """A pause of one scaler, or of every scaler of one host (``host``, a ``KICI_HOST_NAME``): no
    new agent is spawned or bound for them, and ``/scale`` answers their jobs 409 ``paused`` naming
    who asked, who approved and why (``scalers.pauses``). Written and removed only by the approved
    ``pause`` and ``resume`` operations. A statement trigger (migration ``0018``) changes the
    ``ConfigGeneration`` token with every write, so admission's routing view sees it at once."""

    scaler = models.OneToOneField(Scaler, null=True, blank=True, on_delete=models.CASCADE, related_name="pause")
    host = models.CharField(max_length=200, blank=True, help_text="the paused host; '' for a scaler's pause")
    reason = models.CharField(max_length=500, help_text="why, as the requester wrote it")
    requested_by = models.CharField(max_length=150, help_text="user name of the requester")
    approved_by = models.CharField(max_length=150, blank=True, help_text="user name of the approver; 'policy'")
    operation_ref = models.PositiveIntegerField(null=True, blank=True, help_text="the pause operation's number")
    drain = models.BooleanField(default=False, help_text="its running agents were drained with it")
    paused_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host"], condition=~models.Q(host=""), name="pause_one_per_host"),
            models.CheckConstraint(
                condition=(models.Q(scaler__isnull=True) & ~models.Q(host=""))
                | (models.Q(scaler__isnull=False) & models.Q(host="")),
                name="pause_scaler_or_host",
            ),
        ]

    def __str__(self):
        return f"pause of {'host ' + self.host if self.host else 'scaler ' + str(self.scaler_id)}"


class LabelSet(models.Model):
    """One ``labelSets[]`` entry of a scaler, in config order (``index``)."""

    scaler = models.ForeignKey(Scaler, on_delete=models.CASCADE, related_name="label_sets")
    index = models.PositiveIntegerField()
    labels = models.JSONField(help_text="canonical (trimmed, lower-case) declared labels")
    normalized = models.CharField(max_length=1000, help_text="sorted, de-duplicated, comma-joined")
    config = models.JSONField(default=dict, blank=True, help_text="the whole label-set entry as imported")
    host_access = models.JSONField(
        null=True, blank=True, help_text="the networkPolicy.hostAccess in force; null = the default"
    )
    host_access_override = models.BooleanField(
        default=False, help_text="host_access was set in the console: an import keeps it over the file's value"
    )
    host_access_override_operation = models.PositiveIntegerField(
        null=True, blank=True, help_text="id of the approved operation that set the console value"
    )
    host_access_override_at = models.DateTimeField(null=True, blank=True)
    retired = models.BooleanField(default=False)

    class Meta:
        ordering = ["scaler__name", "index"]
        constraints = [models.UniqueConstraint(fields=["scaler", "index"], name="labelset_scaler_index_unique")]

    def __str__(self):
        return f"{self.scaler.name}[{self.index}] {self.normalized}"

    @property
    def max_uses(self) -> int:
        """Jobs one agent of this label set serves before it is torn down (``maxUses``; 1, single-use,
        when unset)."""
        return int((self.config or {}).get("maxUses") or 1)

    @property
    def debug_hold(self) -> dict:
        """Its ``debugHold`` entry as imported (``{onFailure?, durationSeconds?}``); {} when unset."""
        return dict((self.config or {}).get("debugHold") or {})

    @property
    def file_host_access(self) -> list[str] | None:
        """The ``networkPolicy.hostAccess`` of the imported file entry (``config``); None = the default."""
        value = ((self.config or {}).get("networkPolicy") or {}).get("hostAccess")
        return list(value) if value is not None else None

    @property
    def host_access_differs(self) -> bool:
        """The value in force (set in the console) is not the file's."""
        return self.host_access_override and self.host_access != self.file_host_access


class Reservation(models.Model):
    """Capacity held for one agent from admission until release.

    ``cpus`` and ``memory_bytes`` are the resolved *requests*; caps compare their sums.
    """

    scaler = models.ForeignKey(Scaler, on_delete=models.CASCADE, related_name="reservations")
    agent = models.OneToOneField("agents.Agent", on_delete=models.CASCADE, related_name="reservation")
    machine_pool = models.ForeignKey(MachinePool, null=True, blank=True, on_delete=models.SET_NULL)
    cpus = models.FloatField(default=0)
    memory_bytes = models.BigIntegerField(default=0)
    limit_cpus = models.FloatField(default=0)
    limit_memory_bytes = models.BigIntegerField(default=0)
    owner_instance = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner_instance"])]

    def __str__(self):
        return f"reservation {self.agent_id} on {self.scaler_id}"


class UsageTally(models.Model):
    """One change to what admission counts, written by the database itself: triggers on
    ``scalers_reservation`` and ``agents_agent`` add a row per scaler (and machine pool) for every
    statement that changes its reservations or counted agents, whoever runs it. A scaler's usage is
    the sum of its rows; ``cpus`` is numeric, so additions and removals cancel exactly. Why a tally,
    and its fold: docs/admission.md ("One batch").
    """

    scaler_id = models.BigIntegerField(null=True)
    machine_pool_id = models.BigIntegerField(null=True)
    reservations = models.IntegerField(default=0)
    cpus = models.DecimalField(max_digits=40, decimal_places=15, default=0)
    memory_bytes = models.BigIntegerField(default=0)
    active = models.IntegerField(default=0, help_text="agents in an active state")
    spawns_in_flight = models.IntegerField(default=0, help_text="spawning agents holding a spawn job id")
    spawns_waiting = models.IntegerField(default=0, help_text="spawning agents waiting for a spawn slot")

    def __str__(self):
        return f"usage tally of scaler {self.scaler_id}"


# --- Admission records ------------------------------------------------------------------------


class ScaleOutcome(models.TextChoices):
    """What admission answered a scale request. ``assigned`` = an idle warm agent was bound."""

    SPAWNING = "spawning", "spawning"
    ASSIGNED = "assigned", "assigned a warm agent"
    AT_CAPACITY = "at-capacity", "at capacity"
    EXCEEDS_CAP = "exceeds-cap", "exceeds a cap: can never be admitted"
    NO_BACKEND = "no-backend", "no matching label set"
    SKIPPED = "skipped", "skipped"
    PAUSED = "paused", "refused: the scaler or its host is paused"
    #: Not stored: the job already has a live agent, asked for the same way; it is answered again.
    REPLAYED = "replayed", "answered again: the job's live agent"
    #: Not stored: the job (or the idempotency key) has a live agent asked for otherwise.
    IDEMPOTENCY_MISMATCH = "idempotency-mismatch", "refused: asked for otherwise than the live agent"


#: Outcomes that leave the job queued at the orchestrator ("why is this job waiting?"); an
#: ``exceeds-cap`` job waits for a change of configuration, never for capacity.
WAITING_OUTCOMES = (
    ScaleOutcome.AT_CAPACITY,
    ScaleOutcome.EXCEEDS_CAP,
    ScaleOutcome.NO_BACKEND,
    ScaleOutcome.SKIPPED,
    ScaleOutcome.PAUSED,
)
#: How far back a refusal still counts as "waiting" (jobs re-request while they wait).
WAITING_WINDOW = timedelta(hours=6)


class ScaleRequest(models.Model):
    """The latest admission decision for one job (one row per job id, upserted per request).

    ``cap`` names the cap that refused (``maxAgents``, ``globalMaxAgents``, ``resourceCap.cpu``,
    ``resourceCap.memory``, ``globalResourceCap.cpu``, ``globalResourceCap.memory``,
    ``machinePool.cpu``, ``machinePool.memory``, ``maxConcurrentSpawns``); ``attempts`` counts
    the requests seen for the job. Read by the "Why is this job waiting?" page.
    """

    job_id = models.CharField(max_length=200, unique=True)
    run_id = models.CharField(max_length=200, blank=True)
    labels = models.JSONField(default=list, blank=True)
    resources = models.JSONField(null=True, blank=True, help_text="the job's resources as requested")
    cpus = models.FloatField(default=0, help_text="resolved request, cpus")
    memory_bytes = models.BigIntegerField(default=0, help_text="resolved request, bytes")
    outcome = models.CharField(max_length=20, choices=ScaleOutcome.choices)
    cap = models.CharField(max_length=40, blank=True)
    reason = models.TextField(blank=True)
    scaler_name = models.CharField(max_length=200, blank=True)
    agent_ref = models.CharField(max_length=100, blank=True, help_text="agent id admitted or assigned")
    token_name = models.CharField(max_length=64, blank=True, help_text="name of the API token that asked last")
    attempts = models.PositiveIntegerField(default=1)
    owner_instance = models.CharField(max_length=200, blank=True)
    first_requested_at = models.DateTimeField()
    decided_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-decided_at"]
        indexes = [models.Index(fields=["outcome", "decided_at"])]

    def __str__(self):
        return f"{self.job_id}: {self.outcome} {self.cap}".strip()


class ApiToken(models.Model):
    """A named bearer token of the orchestrator's API (``scalers.api_tokens``): only its SHA-256 is
    kept; ``scopes`` of ``scale`` (ask for, complete and release agents) and ``read`` (follow
    them). Revoked or past ``expires_at``, it is refused."""

    name = models.CharField(max_length=63, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="the token's first characters, to tell it apart")
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class MetricCounter(models.Model):
    """A Prometheus counter shared by every console process (incremented in SQL, read at scrape).

    ``label_key`` is the canonical ``k=v,k=v`` rendering of ``labels`` (unique with ``name``).
    """

    name = models.CharField(max_length=200)
    label_key = models.CharField(max_length=500, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    value = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "label_key"], name="metriccounter_name_labels_unique")]

    def __str__(self):
        return f"{self.name}{{{self.label_key}}} {self.value}"


class RecoveryReport(models.Model):
    """Counts of one ``recover_state`` run."""

    instance_id = models.CharField(max_length=200)
    trigger = models.CharField(max_length=20, help_text="boot | leader-change | manual")
    spawning_agents_rehydrated = models.PositiveIntegerField(default=0)
    spawning_dropped = models.PositiveIntegerField(default=0)
    agent_jobs_rehydrated = models.PositiveIntegerField(default=0)
    reservations_rehydrated = models.PositiveIntegerField(default=0)
    reservations_dropped = models.PositiveIntegerField(default=0)
    buffered_events_lost = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"recovery {self.trigger} on {self.instance_id} at {self.created_at:%Y-%m-%d %H:%M:%S}"


class ScalerTeardown(models.Model):
    """A retiring scaler that the retirement sweep found empty and tore down."""

    scaler = models.OneToOneField(Scaler, on_delete=models.CASCADE, related_name="teardown")
    torn_down_at = models.DateTimeField(auto_now_add=True)
    detail = models.TextField(blank=True)

    def __str__(self):
        return f"{self.scaler.name} torn down at {self.torn_down_at:%Y-%m-%d %H:%M:%S}"


def _new_installation_id() -> str:
    return uuid.uuid4().hex


class Installation(models.Model):
    """This installation's identity: one row (pk=1), made at first use and never changed.

    Stamped on every sandbox (``scalers.backends.ownership``). It lives in the database, so a
    restored copy of the database carries the same id; the console instance tells the two apart.
    """

    installation_id = models.CharField(max_length=64, unique=True, default=_new_installation_id, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"installation {self.installation_id}"

    @classmethod
    def current_id(cls) -> str:
        """The installation id, creating the row on first use (a concurrent first use reads the
        winner's row). Raises database errors."""
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj.installation_id


class RegistryCredential(models.Model):
    """A named login for a private image registry, admin-managed (``scalers.credentials``).

    ``secret`` holds the password or token encrypted with ``KICI_SECRETS_KEY`` (a Fernet token):
    it is written through :func:`scalers.credentials.encrypt_secret` only, read back only at pull
    time, and never shown, logged or returned. ``registry`` is the host (``[host][:port]``) the
    login is for; it is sent to no other registry.
    """

    name = models.SlugField(max_length=100, unique=True, help_text="what credentialsRef names")
    registry = models.CharField(max_length=255, help_text="registry host[:port], e.g. registry.example.com:5000")
    username = models.CharField(max_length=200)
    secret = models.TextField(editable=False, help_text="the encrypted password or token")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.username}@{self.registry})"


class OrchestratorAdminToken(models.Model):
    """An admin token of a real KiCI orchestrator, admin-managed, named by a label set's
    ``kiciAgent.adminTokenRef`` (``scalers.kici_orchestrator``).

    ``secret`` is the token encrypted with ``KICI_SECRETS_KEY`` (a Fernet token, as for
    :class:`RegistryCredential`): written through :func:`scalers.credentials.encrypt_secret`,
    decrypted only to mint or revoke an agent's token, and never shown, logged or returned.
    """

    name = models.SlugField(max_length=100, unique=True, help_text="what kiciAgent.adminTokenRef names")
    secret = models.TextField(editable=False, help_text="the encrypted admin token")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class CapacitySample(models.Model):
    """What one scaler held against its caps at ``taken_at``, written by the leading sweeper every
    ``KICI_CAPACITY_SAMPLE_SECONDS`` (``scalers.samples``). ``agents``: reservation rows; ``running``;
    ``cpus``/``memory_bytes``: summed reserved requests; ``max_*``: the caps then (``None`` =
    uncapped); ``registered`` and ``latency_p50_seconds``/``latency_p95_seconds``: the ``/scale``
    agents registered since the previous sample and their admission-to-registration percentiles.
    Each field and the retention: docs/capacity-charts.md ("Samples").
    """

    scaler = models.ForeignKey(Scaler, on_delete=models.CASCADE, related_name="capacity_samples")
    taken_at = models.DateTimeField(db_index=True)
    agents = models.PositiveIntegerField(default=0)
    running = models.PositiveIntegerField(default=0)
    cpus = models.FloatField(default=0)
    memory_bytes = models.BigIntegerField(default=0)
    max_agents = models.PositiveIntegerField()
    max_cpu = models.FloatField(null=True, blank=True)
    max_memory_bytes = models.BigIntegerField(null=True, blank=True)
    registered = models.PositiveIntegerField(default=0)
    latency_p50_seconds = models.FloatField(null=True, blank=True)
    latency_p95_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["scaler", "taken_at"]
        indexes = [models.Index(fields=["scaler", "taken_at"], name="capsample_scaler_time")]

    def __str__(self):
        return f"{self.scaler_id} at {self.taken_at:%Y-%m-%d %H:%M:%S}: {self.agents}/{self.max_agents}"
