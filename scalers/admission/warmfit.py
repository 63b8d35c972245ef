"""Which idle warm agent may serve a job. Pure functions.

A warm agent was spawned with the label set's / defaults' shape, so it only serves a job whose
*declared* resources match that shape exactly: every field the job declares (after mirroring the
job's own layer), on both sides (requests and limits), must equal the agent's
reservation. A job that declares nothing fits any warm agent; a job bringing its own container
image never uses one (the image is chosen at spawn time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lib.units import parse_memory
from scalers.resources import mirror_request


@dataclass(frozen=True)
class Shape:
    """A reservation's shape: requests and limits, cpus (cores) and memory (bytes)."""

    cpus: float
    memory_bytes: int
    limit_cpus: float
    limit_memory_bytes: int


def _eq_cpus(a: float, b: float) -> bool:
    return abs(float(a) - float(b)) < 1e-9


def warm_agent_can_serve(job_resources: Any, shape: Shape | None, *, job_image: Any = None) -> bool:
    """True when an idle warm agent reserved as ``shape`` may take a job with ``job_resources``.

    ``job_resources`` is the job's ``resources`` (flat ``{cpus, memory}``, nested
    ``{requests, limits}``, a ``scalers.config.schema.ResourceRequest``, or ``None``). ``shape`` is
    ``None`` for a non-warm agent, which always may. Raises ``ValueError`` for an
    unparsable memory string (the API validates before this is reached).
    """
    if shape is None:
        return True
    if job_image:
        return False
    mirrored = mirror_request(job_resources)
    if not mirrored.declared:
        return True
    for side, cpus, mem in (
        (mirrored.requests, shape.cpus, shape.memory_bytes),
        (mirrored.limits, shape.limit_cpus, shape.limit_memory_bytes),
    ):
        if side is None:  # declared: both sides are set
            continue
        if side.cpus is not None and not _eq_cpus(side.cpus, cpus):
            return False
        if side.memory is not None and parse_memory(side.memory) != mem:
            return False
    return True
