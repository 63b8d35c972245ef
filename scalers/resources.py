"""Resource requests: mirroring, the job → label set → defaults cascade, limits. Pure functions.

``cpus`` are (fractional) CPUs, ``mem_bytes`` bytes; a resolved ``0`` means undeclared and is
dropped from the limits handed to a backend (:func:`effective_limits`). Inputs are
``scalers.config.schema.ResourceRequest`` objects (nested shape, as the schema turns a flat
``{cpus, memory}`` into) or plain mappings of either shape, or ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lib.units import parse_memory

#: The smallest CPU limit the runtime enforces: docker's NanoCpus is CPUs × 10⁹ and the daemon
#: refuses under 10⁷ (0.01 CPU); a smaller value would round to 0, which means no limit at all.
MIN_CPUS = 0.01
#: The smallest memory limit docker accepts (6 MiB); a smaller one is refused by the daemon at
#: spawn time, and 0 means no limit.
MIN_MEMORY_BYTES = 6 * 1024 * 1024


def resource_floor_error(cpus: Any = None, mem_bytes: int | None = None) -> str | None:
    """Why a declared ``cpus`` (CPUs) or memory (``mem_bytes``, bytes) is below what the runtime can
    enforce (:data:`MIN_CPUS`, :data:`MIN_MEMORY_BYTES`); None when both are fine or undeclared
    (None). The caller names the field and the value."""
    if cpus is not None and cpus < MIN_CPUS:
        return (
            f"below {MIN_CPUS}, the smallest CPU limit the runtime can enforce "
            "(docker would round it to no limit at all)"
        )
    if mem_bytes is not None and mem_bytes < MIN_MEMORY_BYTES:
        return f"below 6m ({MIN_MEMORY_BYTES} bytes), the smallest memory limit the runtime accepts"
    return None


@dataclass(frozen=True)
class ResourceAmount:
    """One resolved side: ``cpus`` (CPUs, 0 = undeclared), ``mem_bytes`` (bytes, 0 = undeclared)."""

    cpus: float = 0
    mem_bytes: int = 0

    @property
    def is_zero(self) -> bool:
        return not self.cpus and not self.mem_bytes


@dataclass(frozen=True)
class _Side:
    """One declared side before cascading: ``None`` field = not declared at this layer."""

    cpus: float | None = None
    memory: str | None = None


@dataclass(frozen=True)
class MirroredRequest:
    """A layer after mirroring: both sides set, or both ``None`` (undeclared)."""

    requests: _Side | None
    limits: _Side | None

    @property
    def declared(self) -> bool:
        return self.requests is not None


@dataclass(frozen=True)
class ResolvedResources:
    """Result of :func:`resolve_resources`: resolved ``requests`` and ``limits``."""

    requests: ResourceAmount
    limits: ResourceAmount


@dataclass(frozen=True)
class EffectiveLimits:
    """The cpu / memory ceiling handed to a backend for one spawn: ``cpus`` in cores, ``mem_bytes``
    in bytes; 0 = not limited."""

    cpus: float = 0.0
    mem_bytes: int = 0

    @property
    def is_set(self) -> bool:
        return self.cpus > 0 or self.mem_bytes > 0


def _side(value: Any) -> _Side | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return _Side(cpus=value.get("cpus"), memory=value.get("memory"))
    return _Side(cpus=getattr(value, "cpus", None), memory=getattr(value, "memory", None))


def _sides(request: Any) -> tuple[_Side | None, _Side | None]:
    if request is None:
        return None, None
    if isinstance(request, dict):
        if set(request) & {"requests", "limits"}:
            return _side(request.get("requests")), _side(request.get("limits"))
        if set(request) & {"cpus", "memory"}:  # flat shape: both sides alike
            flat = _side(request)
            return flat, flat
        return None, None
    return _side(getattr(request, "requests", None)), _side(getattr(request, "limits", None))


def mirror_request(request: Any) -> MirroredRequest:
    """Mirror one layer's one-sided request.

    Only ``requests`` ⇒ limits := requests; only ``limits`` ⇒ requests := limits;
    both ⇒ unchanged; neither (or ``None``) ⇒ undeclared (both ``None``).
    """
    requests, limits = _sides(request)
    if requests is None and limits is None:
        return MirroredRequest(None, None)
    if requests is None:
        requests = limits
    if limits is None:
        limits = requests
    return MirroredRequest(requests, limits)


def _first_defined(layers: list[_Side | None], attr: str) -> Any:
    for side in layers:
        if side is not None:
            value = getattr(side, attr)
            if value is not None:
                return value
    return None


def _resolve_side(layers: list[_Side | None]) -> ResourceAmount:
    cpus = _first_defined(layers, "cpus")
    memory = _first_defined(layers, "memory")
    mem_bytes = parse_memory(memory) if memory is not None else 0
    return ResourceAmount(cpus=float(cpus) if cpus is not None else 0, mem_bytes=mem_bytes)


def resolve_resources(job: Any = None, label_set: Any = None, defaults: Any = None) -> ResolvedResources:
    """Resolve effective requests and limits through the cascade: each layer (``job``, the label set's
    ``resources``, ``defaults.resources``) is mirrored, then per field and side the first layer that
    defines it wins (none ⇒ 0). Memory strings are parsed to bytes; a bad one raises
    ``lib.units.InvalidMemoryFormat`` (a ``ValueError``). Example: defaults ``{requests: {cpus 1,
    1g}, limits: {cpus 2, 2g}}``, label set flat ``{cpus 4, 8g}``, job ``{limits: {memory: 16g}}`` ⇒
    requests and limits both ``ResourceAmount(cpus=4, mem_bytes=17179869184)``.
    """
    layers = [mirror_request(job), mirror_request(label_set), mirror_request(defaults)]
    requests = _resolve_side([m.requests for m in layers])
    limits = _resolve_side([m.limits for m in layers])
    return ResolvedResources(requests=requests, limits=limits)


def effective_limits(cpus: float | None, mem_bytes: int | None) -> EffectiveLimits:
    """The ceiling to hand to a backend from resolved limits (``None`` or 0 = not limited).

    ``effective_limits(2, 0)`` ⇒ ``EffectiveLimits(cpus=2.0, mem_bytes=0)``, not set on memory.
    """
    return EffectiveLimits(cpus=float(cpus or 0), mem_bytes=int(mem_bytes or 0))


def has_declared_shape(label_set: Any = None, defaults: Any = None) -> bool:
    """Whether a label set resolves to a non-zero shape from itself or ``defaults``
    (cpus or memory on either side; limits alone count). A warm pool is only
    configured for such sets. Raises ``InvalidMemoryFormat`` like
    :func:`resolve_resources`."""
    resolved = resolve_resources(None, label_set, defaults)
    return not (resolved.requests.is_zero and resolved.limits.is_zero)
