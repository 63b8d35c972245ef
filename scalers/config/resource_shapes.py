"""Resource requests (nested or flat, never mixed), resource caps and machine pools, SPEC (a.4)-(a.5)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Discriminator, Field, Tag

from lib.units import parse_memory

from .fields import NonEmptyStr, Number, _memory_string, _Strict
from .issues import _FLAT, _NESTED


class ResourceSpec(_Strict):
    """One side of a resource request: ``{cpus?: number > 0 ≤ 256, memory?: string}``.

    ``memory`` is NOT parsed here (SPEC a.3: ``4Gi`` passes the schema and fails at
    use); see ``scalers.resources``. SPEC (a.4).
    """

    cpus: Number | None = Field(default=None, gt=0, le=256)
    memory: str | None = None


class ResourceRequest(_Strict):
    """Nested resource request ``{requests?: ResourceSpec, limits?: ResourceSpec}``.

    A flat ``{cpus?, memory?}`` in YAML becomes ``{requests: copy, limits: copy}``
    (an empty flat object becomes ``{}``); one-sided nested requests are kept as
    written, mirroring happens at resolution (``scalers.resources``). SPEC (a.4).
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
        keys = {k for k, v in value.items() if v is not None}
        if keys <= _NESTED_KEYS:
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
    """``{maxCpu?: number > 0, maxMemory?: memory string}``, SPEC (a.5).

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
    """``machinePools[]`` item: a cap shared by several scalers, SPEC (a.2)."""

    name: NonEmptyStr
    cap: ResourceCap
