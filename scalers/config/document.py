"""The top level of ``scalers.yaml``: defaults, the firecracker network block and :class:`ScalersConfig`, SPEC (a.2), (a.9)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from .entries import ScalerEntry
from .fields import Integer, NonEmptyStr, _Loose
from .issues import SchemaIssue, describe_value
from .refinements import _cross_issues, scaler_entry_issues
from .resource_shapes import MachinePool, ResourceCap, ResourceRequest, Resources


class Defaults(_Loose):
    """``defaults`` (only ``resources`` is recognised), SPEC (a.2)."""

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
    """Top-level ``firecracker`` network block (not strict), SPEC (a.9).

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
    """A whole, valid ``scalers.yaml`` (main file plus drop-ins), SPEC (a).

    Attributes: ``version`` (1), ``global_max_agents`` (50), ``defaults``
    (:class:`Defaults` or ``None``), ``global_resource_cap`` (:class:`ResourceCap` or
    ``None``; use ``.max_cpu`` / ``.max_memory_bytes``), ``machine_pools``,
    ``scalers`` (:class:`ScalerEntry` list, config order), ``firecracker``
    (:class:`FirecrackerNetwork` or ``None``; :attr:`firecracker_network` gives the
    defaults when absent). Validating one always runs every refinement; for
    per-problem paths use :func:`validate_document` or ``scalers.config.loader``.
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
        return self.defaults.resources if self.defaults else None

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
