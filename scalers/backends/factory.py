"""The backend of a scaler, picked by its type: where an admitted agent actually runs.

``container`` (``container.backend.ContainerBackend``), ``bare-metal`` (``baremetal.BareMetalBackend``),
``event`` (``event.EventBackend``) and ``firecracker`` (``firecracker.adapter.FirecrackerScalerBackend``).
Spawns run in the rq job ``scalers.jobs.spawn_agent``.
"""

from __future__ import annotations

from typing import Any

from scalers.choices import ScalerType
from scalers.models import Scaler

from .baremetal import BareMetalBackend
from .base import Backend
from .container.backend import ContainerBackend
from .event import EventBackend
from .firecracker.adapter import FirecrackerScalerBackend


def get_backend(scaler: Scaler, **options: Any) -> Backend:
    """The backend for ``scaler`` by ``scaler.type`` (``scalers.choices.ScalerType``).

    ``options`` are passed to the backend constructor (tests inject ``docker``, ``is_registered``,
    ``tracked_ids``, ``nft``). Raises ``ValueError`` naming the type for an unknown one.
    """
    kind = scaler.type
    if kind == ScalerType.CONTAINER:
        return ContainerBackend(scaler, **options)
    if kind == ScalerType.BARE_METAL:
        return BareMetalBackend(scaler, **options)
    if kind == ScalerType.EVENT:
        return EventBackend(scaler, **options)
    if kind == ScalerType.FIRECRACKER:
        return FirecrackerScalerBackend(scaler, **options)
    raise ValueError(f"scaler {scaler.name!r} has type {kind!r}, which no backend implements")
