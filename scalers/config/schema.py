"""The ``scalers.yaml`` schema (pydantic v2); existing ``scalers.yaml`` files are read unchanged.
Every problem is reported with its own path, and a ``ScalersConfig`` is always fully valid however
it was built. Key spelling, strictness and the two layers of validation: docs/configuration.md
("The file's schema").
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from lib.units import MEMORY_FORMAT, MEMORY_RE, InvalidMemoryFormat, parse_memory
from network.host_access import parse_host_access_entry
from scalers import labels as labelmod
from scalers.resources import MIN_CPUS, resource_floor_error

# --------------------------------------------------------------------------- validation issues


# Tags of the two resource shapes; stripped from error paths (see _loc).
_NESTED = "__nested__"
_FLAT = "__flat__"


@dataclass(frozen=True)
class SchemaIssue:
    """One validation problem: ``path`` (keys and list indexes from the document root)
    and a human ``message`` that names the offending value where there is one."""

    path: tuple[str | int, ...]
    message: str

    @property
    def dotted_path(self) -> str:
        """zod-style dotted path, e.g. ``scalers.0.labelSets.1.labels``."""
        return ".".join(str(p) for p in self.path)

    def __str__(self) -> str:
        return f"{self.dotted_path or '(document)'}: {self.message}"


def describe_value(value: Any, limit: int = 80) -> str:
    """Short JSON-ish rendering of an input value for error messages."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _loc(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    return tuple(p for p in loc if p not in (_NESTED, _FLAT))


_PLAIN_MESSAGES = {
    "string_type": "Expected a string",
    "bool_type": "Expected true or false",
    "list_type": "Expected a list",
    "dict_type": "Expected a mapping",
    "model_type": "Expected a mapping",
    "model_attributes_type": "Expected a mapping",
}


def _issue_message(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    loc = err.get("loc", ())
    received = describe_value(err.get("input"))
    if kind == "missing":
        return "Required"
    if kind == "extra_forbidden":
        return f'Unrecognized key "{loc[-1] if loc else "?"}" (unrecognized_keys), received {received}'
    if kind == "value_error":
        return str(err.get("ctx", {}).get("error", err["msg"]))
    if kind in ("number_type", "int_type", "version") and "received" in err["msg"]:
        return err["msg"]
    if kind == "resources_shape":
        return f"{err['msg']}, received {received}"
    if kind == "too_short":
        ctx = err.get("ctx", {})
        return f"Expected at least {ctx.get('min_length', 1)} item(s), received {received}"
    if kind in _PLAIN_MESSAGES:
        return f"{_PLAIN_MESSAGES[kind]}, received {received}"
    return f"{err['msg']}, received {received}"


def _issues_from(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[SchemaIssue]:
    return [SchemaIssue(prefix + _loc(err["loc"]), _issue_message(err)) for err in exc.errors(include_url=False)]


# --------------------------------------------------------------------------- scalar types


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError(
            "number_type", "Expected a number, received {received}", {"received": describe_value(value)}
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError(
            "number_type", "Expected a finite number, received {received}", {"received": describe_value(value)}
        )
    return value


def _integer(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError(
            "int_type", "Expected an integer, received {received}", {"received": describe_value(value)}
        )
    if isinstance(value, float):
        if not value.is_integer():
            raise PydanticCustomError(
                "int_type", "Expected an integer, received {received}", {"received": describe_value(value)}
            )
        return int(value)
    return value


#: A JSON/YAML number (int or float, never a bool or a numeric string), as zod's z.number().
Number = Annotated[int | float, BeforeValidator(_number)]
#: An integer (an integral float such as 2.0 is accepted, as in JavaScript).
Integer = Annotated[int, BeforeValidator(_integer)]


def _label(value: str, *, where: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"Label must not be empty, received {describe_value(value)}")
    if labelmod.is_reserved_label(text):
        raise ValueError(
            f"Labels with 'kici:' prefix are reserved and cannot be used in {where}, received {describe_value(value)}"
        )
    if "," in text:
        raise ValueError(
            f"Labels must not contain ',' (label sets are keyed as comma-joined lists), "
            f"received {describe_value(value)}"
        )
    return text.lower()


def _set_label(value: str) -> str:
    return _label(value, where="scaler labelSets")


def _mandatory_label(value: str) -> str:
    return _label(value, where="mandatoryLabels")


Label = Annotated[str, AfterValidator(_set_label)]
MandatoryLabel = Annotated[str, AfterValidator(_mandatory_label)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


def _host_access_entry(value: str) -> str:
    parse_host_access_entry(value)  # raises ValueError naming the entry
    return value


HostAccessEntry = Annotated[str, AfterValidator(_host_access_entry)]


def _memory_string(value: str) -> str:
    try:
        parse_memory(value)
    except InvalidMemoryFormat as exc:
        raise ValueError(str(exc)) from None
    return value


# --------------------------------------------------------------------------- base classes


class _Strict(BaseModel):
    """Object that refuses unknown keys (zod ``.strict()``)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(v is None for v in data.values()):
            return {k: v for k, v in data.items() if v is not None}
        return data


class _Loose(_Strict):
    """Object that silently drops unknown keys (zod's default)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="ignore", frozen=True)


# --------------------------------------------------------------------------- resource shapes


class ResourceSpec(_Strict):
    """One side of a resource request: ``{cpus?: number ≥ 0.01 ≤ 256, memory?: string ≥ 6m}``
    (``scalers.resources.MIN_CPUS`` / ``MIN_MEMORY_BYTES``: below them docker enforces no limit or
    refuses the container).

    ``memory`` is NOT parsed here (``4Gi`` passes the schema and fails at use); see
    ``scalers.resources``.
    """

    cpus: Number | None = Field(default=None, gt=0, le=256, json_schema_extra={"minimum": MIN_CPUS})
    memory: str | None = Field(
        default=None, json_schema_extra={"pattern": f"^{MEMORY_RE.pattern}$", "format": MEMORY_FORMAT}
    )

    @field_validator("cpus", mode="after")
    @classmethod
    def _cpus_enforceable(cls, value: Any) -> Any:
        if (problem := resource_floor_error(cpus=value)) is not None:
            raise PydanticCustomError("cpus_too_small", problem)
        return value

    @field_validator("memory", mode="after")
    @classmethod
    def _memory_enforceable(cls, value: Any) -> Any:
        try:
            mem_bytes = parse_memory(value) if value is not None else None
        except InvalidMemoryFormat:
            return value  # a bad format is reported where memory is parsed
        if (problem := resource_floor_error(mem_bytes=mem_bytes)) is not None:
            raise PydanticCustomError("memory_too_small", problem)
        return value


class ResourceRequest(_Strict):
    """Nested resource request ``{requests?: ResourceSpec, limits?: ResourceSpec}``.

    A flat ``{cpus?, memory?}`` in YAML becomes ``{requests: copy, limits: copy}``
    (an empty flat object becomes ``{}``); one-sided nested requests are kept as
    written, mirroring happens at resolution (``scalers.resources``).
    """

    requests: ResourceSpec | None = None
    limits: ResourceSpec | None = None

    @property
    def is_empty(self) -> bool:
        return self.requests is None and self.limits is None


_NESTED_KEYS = {"requests", "limits"}
_FLAT_KEYS = {"cpus", "memory"}


def _resource_shape(value: Any) -> str | None:
    if isinstance(value, ResourceRequest):
        return _NESTED
    if isinstance(value, ResourceSpec):
        return _FLAT
    if isinstance(value, dict):
        # The shape is read from the keys it knows; an unknown one (``cpu``) is then refused by
        # that shape's model, naming the key, not taken for a mix of the two shapes.
        keys = {k for k, v in value.items() if v is not None} & (_NESTED_KEYS | _FLAT_KEYS)
        if keys and keys <= _NESTED_KEYS:
            return _NESTED
        if keys <= _FLAT_KEYS:
            return _FLAT
    return None


def _flat_to_nested(value: ResourceRequest | ResourceSpec) -> ResourceRequest:
    if isinstance(value, ResourceSpec):
        if value.cpus is None and value.memory is None:
            return ResourceRequest()
        return ResourceRequest(requests=value, limits=value.model_copy())
    return value


#: ``resources`` of a label set or of ``defaults``: nested or flat, never mixed.
Resources = Annotated[
    Annotated[
        Annotated[ResourceRequest, Tag(_NESTED)] | Annotated[ResourceSpec, Tag(_FLAT)],
        Discriminator(
            _resource_shape,
            custom_error_type="resources_shape",
            custom_error_message=(
                "Expected either {requests?: {cpus?, memory?}, limits?: {cpus?, memory?}} "
                "or a flat {cpus?, memory?}; the two shapes cannot be mixed"
            ),
        ),
    ],
    AfterValidator(_flat_to_nested),
]


class ResourceCap(_Strict):
    """``{maxCpu?: number > 0, maxMemory?: memory string}``.

    ``maxMemory`` is parsed during validation (error at ``maxMemory``). Normalised
    values: :attr:`max_cpu` (cpus, or ``None``) and :attr:`max_memory_bytes` (bytes,
    or ``None``). An empty cap is legal and caps nothing.
    """

    max_cpu: Number | None = Field(default=None, gt=0)
    max_memory: Annotated[str, AfterValidator(_memory_string)] | None = None

    @property
    def max_memory_bytes(self) -> int | None:
        return None if self.max_memory is None else parse_memory(self.max_memory)


class MachinePool(_Strict):
    """``machinePools[]`` item: a cap shared by several scalers."""

    name: NonEmptyStr
    cap: ResourceCap


# --------------------------------------------------------------------------- scaler entries


SCALER_TYPES = ("container", "bare-metal", "firecracker", "event")


#: ``HH:MM`` on a 24-hour clock, ``24:00`` being the end of the day.
ClockTime = Annotated[str, Field(pattern=r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$")]


class WarmPeriod(_Strict):
    """One ``warmPool.schedule`` entry (strict): on ``days`` (every day when absent), from ``from``
    to ``to`` (``HH:MM`` in ``warmPool.timeZone``; a ``to`` at or before ``from`` runs past
    midnight; both absent: the whole day), the pool's size is ``size`` (int ≥ 0)."""

    days: list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]] | None = Field(default=None, min_length=1)
    start: ClockTime | None = Field(default=None, alias="from")
    end: ClockTime | None = Field(default=None, alias="to")
    size: Integer = Field(ge=0)

    @model_validator(mode="after")
    def _both_ends_or_none(self) -> WarmPeriod:
        if (self.start is None) != (self.end is None):
            raise ValueError("give both from and to (HH:MM), or neither for the whole day")
        return self


def _time_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {describe_value(value)} (an IANA name such as Europe/Berlin)") from exc
    return value


class WarmPool(_Loose):
    """``warmPool`` (not strict): ``enabled`` (false), ``size`` (int ≥ 0,
    0), ``idleTimeoutSeconds`` (seconds, 300, no lower bound), ``schedule`` (periods with their own
    size, the first that matches wins, else ``size``; ``scalers.warm_schedule``) in ``timeZone``
    (an IANA name, UTC)."""

    enabled: StrictBool = False
    size: Integer = Field(default=0, ge=0)
    idle_timeout_seconds: Number = 300
    schedule: list[WarmPeriod] | None = None
    time_zone: Annotated[str, AfterValidator(_time_zone)] = "UTC"


class Platform(_Strict):
    """Declared platform of a scaler's agents (strict)."""

    os: Literal["linux", "macos", "windows"]
    arch: Literal["x64", "arm64"]


class NetworkPolicy(_Loose):
    """``networkPolicy`` of a label set (not strict).

    ``allowlist``: forward-hook exceptions (strings, not validated); ``denyAll``:
    drop everything else (false); ``hostAccess``: host-access entries,
    each validated with ``network.host_access.parse_host_access_entry``. ``None`` =
    the default host access; ``[]`` = nothing on the host.
    """

    allowlist: list[str] | None = None
    deny_all: StrictBool = False
    host_access: list[HostAccessEntry] | None = None


def kici_agent_url(value: str) -> str:
    """A real KiCI agent's orchestrator URL: ``ws://`` or ``wss://`` with a host, ending ``/ws``,
    without credentials, query or fragment. Returns it; raises ``ValueError`` saying what is wrong."""
    parsed = urlsplit(value)
    if parsed.scheme not in ("ws", "wss") or not parsed.hostname or not parsed.path.endswith("/ws"):
        raise ValueError(
            f"must be the orchestrator's WebSocket URL (ws:// or wss://, ending in /ws), got {value!r:.120}"
        )
    if parsed.query or parsed.fragment or parsed.username or parsed.password:
        raise ValueError(f"must carry no credentials, query or fragment, got {value!r:.120}")
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise ValueError(f"has a bad port: {exc}") from None
    return value


def _admin_url(value: str) -> str:
    parsed = urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.username or parsed.password:
        raise ValueError(f"must be an http:// or https:// URL without credentials, got {value!r:.120}")
    return value.rstrip("/")


class KiciAgent(_Strict):
    """``kiciAgent`` of a label set (strict): its sandbox runs the real KiCI agent of one orchestrator.

    ``orchestratorUrl``: the agents' WebSocket URL (``ws[s]://host[:port]/ws``).
    ``adminUrl``: the orchestrator's admin API (default: the same host and port over http(s)).
    ``adminTokenRef``: the name of the ``OrchestratorAdminToken`` (stored encrypted, admin-managed)
    the console mints and revokes each agent's token with (``scalers.kici_orchestrator``).
    """

    orchestrator_url: Annotated[str, AfterValidator(kici_agent_url)]
    admin_url: Annotated[str, AfterValidator(_admin_url)] | None = None
    admin_token_ref: NonEmptyStr


#: Bounds of a debug hold's duration in seconds (``scalers.holds``): a kept sandbox holds its slot.
MIN_HOLD_SECONDS = 60
MAX_HOLD_SECONDS = 24 * 3600
DEFAULT_HOLD_SECONDS = 2 * 3600


class DebugHold(_Strict):
    """``debugHold`` of a label set (strict): ``onFailure`` (false) keeps the sandbox of each of its
    agents that fails (spawn given up after the backend call, lost, or a job the orchestrator
    reported failed) instead of tearing it down, for ``durationSeconds`` (7200; 60 to 86400), with
    its isolation rules and its reservation (``scalers.holds``)."""

    on_failure: StrictBool = False
    duration_seconds: Integer = Field(default=DEFAULT_HOLD_SECONDS, ge=MIN_HOLD_SECONDS, le=MAX_HOLD_SECONDS)


class LabelSet(_Strict):
    """One ``labelSets[]`` entry (strict).

    ``labels`` are canonical (trimmed, lower-cased, order and length kept); entries
    may not start with ``kici:``. Type-specific requirements (``image``,
    ``binaryPath``, ``rootfsPath``) are refinements of the scaler, see
    :func:`scaler_entry_issues`.
    """

    labels: list[Label] = Field(min_length=1)
    image: str | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    #: Registry credential (``scalers.credentials``) the label set's ``image`` is pulled with.
    credentials_ref: NonEmptyStr | None = None
    binary_path: str | None = None
    resources: Resources | None = None
    volumes: list[str] | None = None
    container_socket: StrictBool = False
    #: Give the agent container CAP_NET_RAW back (raw and packet sockets, e.g. ``ping`` without
    #: ICMP sockets); dropped by default (``scalers.backends.hostconfig``). Shown as a warning.
    net_raw: StrictBool = False
    env: dict[str, str] | None = None
    backpressure_mode: Literal["pause", "drop"] | None = None
    network_policy: NetworkPolicy | None = None
    rootfs_path: str | None = None
    kernel_path: str | None = None
    initrd_path: str | None = None
    vcpu_count: Integer | None = Field(default=None, gt=0)
    mem_size_mib: Integer | None = Field(default=None, gt=0)
    overlay_drive_size_mib: Integer | None = Field(default=None, gt=0)
    #: Jobs one agent of this label set serves before it is torn down (1: single-use, the default).
    max_uses: Integer = Field(default=1, gt=0)
    #: The sandbox runs the real KiCI agent of this orchestrator (docs/real-kici-agent.md).
    kici_agent: KiciAgent | None = None
    #: Keep the sandbox of a failed agent for debugging (``scalers.holds``).
    debug_hold: DebugHold | None = None

    @property
    def normalized(self) -> str:
        """Normalised key, e.g. ``docker,linux``."""
        return labelmod.normalize_label_set(self.labels)


Role = Literal["builder", "init-runner", "all"]


class ScalerEntry(_Strict):
    """One ``scalers[]`` entry (strict).

    Every type-specific field exists, with its default, on every entry regardless
    of ``type`` (e.g. a container entry has ``vcpu_count == 2``). ``roles`` is
    normalised: absent or containing ``all`` ⇒ ``None`` (all roles), ``[]`` kept.
    ``mandatory_labels`` are canonical and may not start with ``kici:``.
    """

    # shared
    name: NonEmptyStr
    type: Literal["container", "bare-metal", "firecracker", "event"]
    max_agents: Integer = Field(gt=0)
    max_concurrent_spawns: Integer = Field(default=8, gt=0)
    label_sets: list[LabelSet] = Field(min_length=1)
    orchestrator_url: str | None = None
    warm_pool: WarmPool | None = None
    mandatory_labels: list[MandatoryLabel] = Field(default_factory=list)
    platform: Platform | None = None
    roles: list[Role] | None = None
    resource_cap: ResourceCap | None = None
    machine_pool: str | None = None
    # container
    host: str | None = None
    socket_path: str | None = None
    runtime: Literal["docker", "podman", "auto"] = "auto"
    extra_hosts: list[str] | None = None
    network_isolation: StrictBool = True
    # bare-metal
    enforce_cgroups: StrictBool = False
    # firecracker
    firecracker_path: str | None = None
    jailer_path: str | None = None
    kernel_path: str | None = None
    initrd_path: str | None = None
    chroot_base_dir: str = "/srv/jailer"
    uid: Integer | None = Field(default=None, ge=0)
    gid: Integer | None = Field(default=None, ge=0)
    vcpu_count: Integer = Field(default=2, gt=0)
    mem_size_mib: Integer = Field(default=512, gt=0)
    require_sudo: StrictBool = False
    # event
    provisioning_targets: list[NonEmptyStr] | None = None
    claim_ttl_seconds: Integer = Field(default=300, gt=0)
    agent_token_ttl_seconds: Integer = Field(default=600, gt=0)

    @field_validator("roles", mode="after")
    @classmethod
    def _normalise_roles(cls, value: list[str] | None) -> list[str] | None:
        return labelmod.normalize_roles(value)

    @property
    def gates(self) -> list[list[str]]:
        """The gate of each label set, in order."""
        return [labelmod.label_set_gate(ls.labels, self.mandatory_labels, self.platform) for ls in self.label_sets]

    def to_raw(self) -> dict[str, Any]:
        """JSON-safe dict with the YAML key names; validates back to an equal entry."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- refinements within and across entries


def scaler_entry_issues(entry: ScalerEntry) -> list[SchemaIssue]:
    """Per-type requirements and gate reachability of one entry.

    Paths are relative to the entry (``("labelSets", 0, "image")``). Messages are
    kept word for word: users and tests match them.
    """
    return _type_issues(entry) + _label_set_issues(entry)


def _type_issues(entry: ScalerEntry) -> list[SchemaIssue]:
    """The fields ``entry``'s type requires, on the entry and on each label set."""
    issues: list[SchemaIssue] = []
    name = entry.name
    if entry.type == "event":
        if not entry.provisioning_targets:
            issues.append(
                SchemaIssue(
                    ("provisioningTargets",),
                    f"Event scaler \"{name}\" requires a non-empty 'provisioningTargets' array "
                    "(the workflow refs that receive its kici.scaler.scale-up events)",
                )
            )
    elif entry.type == "container":
        for i, ls in enumerate(entry.label_sets):
            if not ls.image:
                issues.append(
                    SchemaIssue(
                        ("labelSets", i, "image"),
                        f"Container scaler \"{name}\" label set [{i}] requires an 'image' field",
                    )
                )
    elif entry.type == "bare-metal":
        for i, ls in enumerate(entry.label_sets):
            if not ls.binary_path and not ls.image:
                issues.append(
                    SchemaIssue(
                        ("labelSets", i, "binaryPath"),
                        f"Bare-metal scaler \"{name}\" label set [{i}] requires a 'binaryPath' "
                        "(spawn a local agent process) or an 'image' (run the agent in a container)",
                    )
                )
    elif entry.type == "firecracker":
        issues.extend(_firecracker_issues(entry))
    return issues


def _firecracker_issues(entry: ScalerEntry) -> list[SchemaIssue]:
    """A firecracker entry's required paths and ids, and each label set's ``rootfsPath``."""
    issues: list[SchemaIssue] = []
    name = entry.name
    for field_name, alias in (
        ("firecracker_path", "firecrackerPath"),
        ("jailer_path", "jailerPath"),
        ("kernel_path", "kernelPath"),
        ("uid", "uid"),
        ("gid", "gid"),
    ):
        value = getattr(entry, field_name)
        if value is None or value == "":
            issues.append(SchemaIssue((alias,), f"Firecracker scaler \"{name}\" requires a '{alias}' field"))
    for i, ls in enumerate(entry.label_sets):
        if not ls.rootfs_path:
            issues.append(
                SchemaIssue(
                    ("labelSets", i, "rootfsPath"),
                    f"Firecracker scaler \"{name}\" label set [{i}] requires a 'rootfsPath' field",
                )
            )
    return issues


def _label_set_issues(entry: ScalerEntry) -> list[SchemaIssue]:
    """Each label set's unreachable gate labels and a ``credentialsRef`` on a label set that pulls no image."""
    issues: list[SchemaIssue] = []
    name = entry.name
    for i, ls in enumerate(entry.label_sets):
        for gate_label in labelmod.unreachable_gate_labels(ls.labels, entry.mandatory_labels, entry.platform):
            issues.append(
                SchemaIssue(
                    ("labelSets", i, "labels"),
                    f'Scaler "{name}" gate label "{gate_label}" is missing from labelSets[{i}].labels — '
                    f'every job routed to this scaler must carry "{gate_label}", so this label set '
                    f'could never be selected; add "{gate_label}" to it or remove it from mandatoryLabels',
                )
            )
        issues.extend(_kici_agent_issues(entry, i, ls))
        pulls_image = entry.type == "container" or (entry.type == "bare-metal" and not ls.binary_path)
        if ls.credentials_ref and not pulls_image:
            issues.append(
                SchemaIssue(
                    ("labelSets", i, "credentialsRef"),
                    f'Scaler "{name}" label set [{i}] names credentialsRef "{ls.credentials_ref}" but pulls '
                    "no image (only container label sets and bare-metal ones without binaryPath do)",
                )
            )
    return issues


#: Scaler types whose sandboxes can run the real KiCI agent (``kiciAgent``).
KICI_AGENT_SCALER_TYPES = ("container", "bare-metal", "firecracker")


def _kici_agent_issues(entry: ScalerEntry, i: int, ls: LabelSet) -> list[SchemaIssue]:
    """A ``kiciAgent`` label set runs in a container, a Firecracker microVM or a bare-metal process
    (``binaryPath``: the command that starts the agent) and gets only the real agent's own
    environment: not on another scaler type, not in bare-metal container mode (a container scaler
    runs the agent's image), not with ``env`` (the real agent refuses an unknown ``KICI_*``
    variable, and its environment is the console's to write), not in a warm pool or for several
    jobs (the real agent exits once idle)."""
    if ls.kici_agent is None:
        return []
    where = f'Scaler "{entry.name}" label set [{i}]'
    issues: list[SchemaIssue] = []
    if entry.type not in KICI_AGENT_SCALER_TYPES:
        issues.append(
            SchemaIssue(
                ("labelSets", i, "kiciAgent"),
                f"{where} sets kiciAgent on a {entry.type} scaler; only container, bare-metal and firecracker "
                "scalers run the real KiCI agent",
            )
        )
    if entry.type == "bare-metal" and not ls.binary_path:
        issues.append(
            SchemaIssue(
                ("labelSets", i, "binaryPath"),
                f"{where} sets kiciAgent without binaryPath; a bare-metal scaler runs the real KiCI agent as "
                "the process binaryPath names (use a container scaler to run it from an image)",
            )
        )
    if ls.env:
        issues.append(
            SchemaIssue(
                ("labelSets", i, "env"),
                f"{where} sets env {sorted(ls.env)} with kiciAgent; the real agent gets only the environment "
                "it accepts (orchestrator URL, id, labels, token, roles, scaler-managed), so remove env",
            )
        )
    if ls.max_uses != 1:
        issues.append(
            SchemaIssue(
                ("labelSets", i, "maxUses"),
                f"{where} sets maxUses {ls.max_uses} with kiciAgent; the real agent exits once idle, "
                "so it serves one job",
            )
        )
    if entry.warm_pool is not None and entry.warm_pool.enabled:
        issues.append(
            SchemaIssue(
                ("warmPool", "enabled"),
                f"{where} sets kiciAgent on a scaler with a warm pool; the real agent exits once idle, "
                "so it cannot wait warm",
            )
        )
    return issues


def _cross_issues(
    scalers: list[tuple[int, ScalerEntry]],
    pool_names: list[Any],
    *,
    pools_known: bool,
) -> list[SchemaIssue]:
    """Top-level rules across entries: pool names unique, pool references defined,
    scaler names unique, no label set shared by two scalers. ``scalers`` pairs each
    parsed entry with its index in the document; ``pool_names`` are the raw names in
    order. With ``pools_known`` false (the pool list itself is invalid) references are
    not checked, to avoid reporting one mistake twice."""
    issues: list[SchemaIssue] = []
    seen_pools: set[Any] = set()
    for i, pool in enumerate(pool_names):
        if not isinstance(pool, str):
            continue
        if pool in seen_pools:
            issues.append(SchemaIssue(("machinePools", i, "name"), f'Duplicate machinePool name "{pool}".'))
        seen_pools.add(pool)
    if pools_known:
        for i, s in scalers:
            if s.machine_pool is not None and s.machine_pool not in seen_pools:
                issues.append(
                    SchemaIssue(
                        ("scalers", i, "machinePool"),
                        f'Scaler "{s.name}" references unknown machinePool "{s.machine_pool}". '
                        "Define it under top-level machinePools[].",
                    )
                )
    first_index: dict[str, int] = {}
    for i, s in scalers:
        if s.name in first_index:
            issues.append(
                SchemaIssue(
                    ("scalers", i, "name"),
                    f'Duplicate scaler name "{s.name}" (first defined at scalers[{first_index[s.name]}])',
                )
            )
        else:
            first_index[s.name] = i
    index_of = [i for i, _ in scalers]
    for overlap in labelmod.find_label_set_overlaps([s for _, s in scalers]):
        doc_index = index_of[overlap.scaler2_index]
        issues.append(
            SchemaIssue(("scalers", doc_index, "labelSets", overlap.label_set_index, "labels"), overlap.message)
        )
    return issues


# --------------------------------------------------------------------------- the top level


class Defaults(_Loose):
    """``defaults`` (only ``resources`` is recognised)."""

    resources: Resources | None = None


def _ipv4_network(value: str) -> str:
    try:
        ipaddress.IPv4Network(value, strict=False)
    except ValueError:
        raise ValueError(f"Expected an IPv4 CIDR such as 10.0.0.0/24, received {describe_value(value)}") from None
    return value


def _ipv4_address(value: str) -> str:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"Expected an IPv4 address, received {describe_value(value)}") from None
    return value


class FirecrackerNetwork(_Loose):
    """Top-level ``firecracker`` network block (not strict).

    Defaults: ``cidr`` 10.0.0.0/24, ``bridgeName`` kici-br0, ``gateway`` 10.0.0.1,
    ``netmask`` 255.255.255.0, ``table`` kici, ``autoProvisionHost`` true. Addresses
    must be IPv4 and the bridge name a valid interface name (≤ 15 characters).
    """

    cidr: Annotated[str, AfterValidator(_ipv4_network)] = "10.0.0.0/24"
    bridge_name: Annotated[str, Field(min_length=1, max_length=15)] = "kici-br0"
    gateway: Annotated[str, AfterValidator(_ipv4_address)] = "10.0.0.1"
    netmask: Annotated[str, AfterValidator(_ipv4_address)] = "255.255.255.0"
    table: NonEmptyStr = "kici"
    auto_provision_host: StrictBool = True


def _version(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value != 1:
        raise PydanticCustomError(
            "version", "Expected version 1, received {received}", {"received": describe_value(value)}
        )
    return value


class _TopLevel(_Loose):
    version: Annotated[int, BeforeValidator(_version)]
    global_max_agents: Integer = Field(default=50, gt=0)
    defaults: Defaults | None = None
    global_resource_cap: ResourceCap | None = None
    machine_pools: list[MachinePool] = Field(default_factory=list)
    firecracker: FirecrackerNetwork | None = None


class ScalersConfig(_TopLevel):
    """A whole, valid ``scalers.yaml`` (main file plus drop-ins): ``version`` (1),
    ``global_max_agents`` (50), ``defaults``, ``global_resource_cap`` (``.max_cpu``,
    ``.max_memory_bytes``), ``machine_pools``, ``scalers`` (config order), ``firecracker``
    (:attr:`firecracker_network` gives the defaults when absent); the optional ones ``None`` when
    absent. Validating one runs every refinement; for per-problem paths use
    :func:`validate_document` or ``scalers.config.loader``.
    """

    scalers: list[ScalerEntry]

    @model_validator(mode="after")
    def _refinements(self) -> ScalersConfig:
        issues = [
            SchemaIssue(("scalers", i, *issue.path), issue.message)
            for i, scaler in enumerate(self.scalers)
            for issue in scaler_entry_issues(scaler)
        ]
        issues += _cross_issues(
            [(i, s) for i, s in enumerate(self.scalers)],
            [p.name for p in self.machine_pools],
            pools_known=True,
        )
        if issues:
            raise ValueError("; ".join(str(i) for i in issues))
        return self

    @property
    def firecracker_network(self) -> FirecrackerNetwork:
        """The firecracker block, or its defaults when the file has none."""
        return self.firecracker or FirecrackerNetwork()

    @property
    def default_resources(self) -> ResourceRequest | None:
        """``defaults.resources`` or ``None``."""
        return cast(ResourceRequest | None, self.defaults.resources) if self.defaults else None

    def scaler(self, name: str) -> ScalerEntry:
        """The entry named ``name``; ``KeyError`` if there is none."""
        for s in self.scalers:
            if s.name == name:
                return s
        raise KeyError(name)

    def machine_pool(self, name: str) -> MachinePool:
        """The pool named ``name``; ``KeyError`` if there is none."""
        for p in self.machine_pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_raw(self) -> dict[str, Any]:
        """JSON-safe dict with the YAML key names; validates back to an equal config."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- validating a whole document


def validate_document(data: Any) -> tuple[ScalersConfig | None, list[SchemaIssue]]:
    """Validate a parsed (merged) ``scalers.yaml`` document, collecting every issue.

    Returns ``(config, [])`` when valid, else ``(None, issues)`` with one
    :class:`SchemaIssue` per problem, paths from the document root. Never raises for
    bad input.
    """
    if not isinstance(data, dict):
        # The type only: a file that is not a scalers.yaml may hold anything (keys, tokens), and
        # its content must not reach an error shown on a page.
        received = "nothing" if data is None else f"a {type(data).__name__}"
        return None, [SchemaIssue((), f"Expected a mapping at the top level, received {received}")]

    issues: list[SchemaIssue] = []
    top_data = {k: v for k, v in data.items() if k != "scalers"}
    top: _TopLevel | None = None
    try:
        top = _TopLevel.model_validate(top_data)
    except ValidationError as exc:
        issues += _issues_from(exc)

    parsed: list[tuple[int, ScalerEntry]] = []
    raw_scalers = data.get("scalers")
    if "scalers" not in data:
        issues.append(SchemaIssue(("scalers",), "Required"))
    elif not isinstance(raw_scalers, list):
        issues.append(SchemaIssue(("scalers",), f"Expected a list, received {describe_value(raw_scalers)}"))
    else:
        for i, raw in enumerate(raw_scalers):
            try:
                entry = ScalerEntry.model_validate(raw)
            except ValidationError as exc:
                issues += _issues_from(exc, ("scalers", i))
                continue
            parsed.append((i, entry))
            issues += [SchemaIssue(("scalers", i, *x.path), x.message) for x in scaler_entry_issues(entry)]

    if top is not None:
        pool_names: list[Any] = [p.name for p in top.machine_pools]
        pools_known = True
    else:
        raw_pools = data.get("machinePools")
        raw_pools = raw_pools if isinstance(raw_pools, list) else []
        pool_names = [p.get("name") if isinstance(p, dict) else None for p in raw_pools]
        # The top level failed elsewhere; references can still be checked if the pools parsed.
        pools_known = not any(i.path[:1] == ("machinePools",) for i in issues)
    issues += _cross_issues(parsed, pool_names, pools_known=pools_known)

    if issues:
        return None, issues
    try:
        return ScalersConfig.model_validate(data), []
    except ValidationError as exc:  # pragma: no cover - both layers check the same rules
        return None, _issues_from(exc)


def parse_resource_request(value: Any) -> ResourceRequest:
    """Validate a job's ``resources`` (same shapes as a label set's).

    Accepts ``None`` (⇒ empty request), a nested ``{requests?, limits?}`` or a flat
    ``{cpus?, memory?}`` mapping; memory strings are additionally parsed so that a
    bad one is refused up front. Raises ``ValueError`` whose message names the
    offending path (``resources.requests.cpus: ...``).
    """
    if value is None:
        return ResourceRequest()
    try:
        result = _ResourcesHolder.model_validate({"resources": value}).resources
    except ValidationError as exc:
        raise ValueError("; ".join(str(i) for i in _issues_from(exc))) from None
    request = cast(ResourceRequest | None, result) or ResourceRequest()
    for side in ("requests", "limits"):
        spec = getattr(request, side)
        if spec is not None and spec.memory is not None:
            try:
                parse_memory(spec.memory)
            except InvalidMemoryFormat as exc:
                raise ValueError(f"resources.{side}.memory: {exc}") from None
    return request


class _ResourcesHolder(_Strict):
    resources: Resources | None = None
