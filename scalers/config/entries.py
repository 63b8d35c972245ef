"""One ``scalers[]`` entry and its parts: label sets, warm pool, platform, network policy, SPEC (a.6)-(a.8)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, field_validator

from scalers import labels as labelmod

from .fields import HostAccessEntry, Integer, Label, MandatoryLabel, NonEmptyStr, Number, _Loose, _Strict
from .resource_shapes import ResourceCap, Resources

SCALER_TYPES = ("container", "bare-metal", "firecracker", "event")


class WarmPool(_Loose):
    """``warmPool`` (not strict), SPEC (a.6): ``enabled`` (false), ``size`` (int ≥ 0,
    0), ``idleTimeoutSeconds`` (seconds, 300, no lower bound)."""

    enabled: StrictBool = False
    size: Integer = Field(default=0, ge=0)
    idle_timeout_seconds: Number = 300


class Platform(_Strict):
    """Declared platform of a scaler's agents (strict), SPEC (a.6)."""

    os: Literal["linux", "macos", "windows"]
    arch: Literal["x64", "arm64"]


class NetworkPolicy(_Loose):
    """``networkPolicy`` of a label set (not strict), SPEC (a.8).

    ``allowlist``: forward-hook exceptions (strings, not validated); ``denyAll``:
    drop everything else (false); ``hostAccess``: host-access entries (SPEC g.1),
    each validated with ``network.host_access.parse_host_access_entry``. ``None`` =
    the default host access; ``[]`` = nothing on the host.
    """

    allowlist: list[str] | None = None
    deny_all: StrictBool = False
    host_access: list[HostAccessEntry] | None = None


class LabelSet(_Strict):
    """One ``labelSets[]`` entry (strict), SPEC (a.7).

    ``labels`` are canonical (trimmed, lower-cased, order and length kept); entries
    may not start with ``kici:``. Type-specific requirements (``image``,
    ``binaryPath``, ``rootfsPath``) are refinements of the scaler, see
    :func:`scaler_entry_issues`.
    """

    labels: list[Label] = Field(min_length=1)
    image: str | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    binary_path: str | None = None
    resources: Resources | None = None
    volumes: list[str] | None = None
    container_socket: StrictBool = False
    env: dict[str, str] | None = None
    backpressure_mode: Literal["pause", "drop"] | None = None
    network_policy: NetworkPolicy | None = None
    rootfs_path: str | None = None
    kernel_path: str | None = None
    vcpu_count: Integer | None = Field(default=None, gt=0)
    mem_size_mib: Integer | None = Field(default=None, gt=0)
    overlay_drive_size_mib: Integer | None = Field(default=None, gt=0)

    @property
    def normalized(self) -> str:
        """Normalised key, e.g. ``docker,linux`` (SPEC b)."""
        return labelmod.normalize_label_set(self.labels)


Role = Literal["builder", "init-runner", "all"]


class ScalerEntry(_Strict):
    """One ``scalers[]`` entry (strict), SPEC (a.6).

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
        """The gate of each label set, in order (SPEC b)."""
        return [labelmod.label_set_gate(ls.labels, self.mandatory_labels, self.platform) for ls in self.label_sets]

    def to_raw(self) -> dict[str, Any]:
        """JSON-safe dict with the YAML key names; validates back to an equal entry."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
