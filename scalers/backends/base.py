"""The backend protocol every scaler type implements, spawn control, and entry options.

A backend instance is cheap and stateless: what it tracks lives in the database (``Agent``
rows), so any console process, and a console after a restart, sees the same view. Backends
record lifecycle events themselves (``scaler.provisioning`` ... ``agent.connecting``) through
``agents.events.record_event``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from django.utils import timezone

if TYPE_CHECKING:
    from agents.models import Agent
    from scalers.models import Scaler

    from .orphans import OrphanTarget


class SpawnAborted(Exception):
    """The spawn was given up: its deadline passed (``reason="deadline"``) or it was cancelled
    (``reason="cancelled"``, e.g. the agent row left ``spawning``). Raised between backend calls by
    :meth:`SpawnControl.check`; the backend cleans up what it created before re-raising.
    """

    def __init__(self, reason: str, stage: str, detail: str = ""):
        self.reason = reason
        self.stage = stage
        super().__init__(detail or f"spawn {reason} during {stage}")


class SpawnError(Exception):
    """A spawn failed at ``stage``; ``captured_output`` holds up to the last 50 output lines."""

    def __init__(self, message: str, stage: str = "", captured_output: list[str] | None = None):
        super().__init__(message)
        self.stage = stage
        self.captured_output = list(captured_output or [])[-50:]


@dataclass
class SpawnControl:
    """Deadline and cancellation for one spawn.

    ``deadline``: wall-clock epoch seconds after which the spawn is abandoned, or ``None``.
    ``cancelled``: returns a reason string when the spawn must stop (None = carry on); the rq job
    wires it to "the agent row is no longer ``spawning``". ``check(stage)`` raises
    :class:`SpawnAborted`; backends call it between runtime calls. ``marks``: the moments of the
    spawn's trace a backend reached (``mark``; names and steps: ``scalers.spawn_trace``).
    """

    deadline: float | None = None
    cancelled: Callable[[], str | None] = lambda: None
    stages: list[str] = field(default_factory=list)
    marks: dict[str, datetime] = field(default_factory=dict)

    def mark(self, name: str, at: datetime | None = None) -> None:
        """Record that the spawn reached the trace mark ``name`` now (or at ``at``, aware)."""
        self.marks[name] = at or timezone.now()

    def remaining(self) -> float | None:
        """Seconds left before the deadline (may be negative), or None without a deadline."""
        return None if self.deadline is None else self.deadline - time.time()

    def check(self, stage: str) -> None:
        """Record ``stage`` and raise :class:`SpawnAborted` when past the deadline or cancelled."""
        self.stages.append(stage)
        if self.deadline is not None and time.time() >= self.deadline:
            raise SpawnAborted("deadline", stage, f"spawn deadline passed before {stage}")
        why = self.cancelled()
        if why:
            raise SpawnAborted("cancelled", stage, f"spawn cancelled before {stage}: {why}")


@dataclass
class SpawnResult:
    """What a successful spawn produced: the backend handle, address, the bridge port bound to it,
    resolved host access, context."""

    managed_id: str
    ip: str | None = None
    bridge_port: str = ""
    host_access: list[str] | None = None
    host_access_explicit: bool = False
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class BootFailure:
    """A boot that failed after the backend call returned (the agent is ``connecting``), as a
    backend's optional ``boot_failure(agent)`` reports it: the ``scaler.failed`` ``detail``, the
    agent's last output lines (``captured``) and extra event fields (``payload``)."""

    detail: str
    captured: list[str] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """What every scaler backend offers. ``boot_failure(agent) -> BootFailure | None`` is optional:
    a quick look (well under a second, from disk or the runtime, from any process of this host) at
    whether a ``connecting`` agent's boot has already failed, asked by the registration watch about
    once a second.
    """

    type: str
    scaler: Scaler

    @property
    def spawns_on_local_host(self) -> bool: ...

    def spawn(self, agent: Agent, control: SpawnControl) -> SpawnResult:
        """Provision the sandbox and record the lifecycle events up to ``agent.connecting``;
        return once it is handed over, never waiting for the registration (``scalers.jobs``
        watches that). On any failure remove what it created and raise ``SpawnError`` /
        ``SpawnAborted``."""
        ...

    def destroy(self, agent: Agent, reason: str = "shutdown") -> None:
        """Tear down; idempotent; an already-gone sandbox is not an error."""
        ...

    def reap_unowned(self, agent_id: str) -> bool:
        """Remove the sandboxes spawned for ``agent_id`` (a refused registration); True when
        something was removed."""
        ...

    def plan_orphans(self) -> list[OrphanTarget]:
        """The orphan sweep's previewable plan."""
        ...

    def apply_orphans(self, plan: list[OrphanTarget]) -> int:
        """Apply ``plan``, re-checking each target; returns how many were removed."""
        ...

    def cleanup_orphans(self) -> int:
        """Plan and apply the orphan sweep."""
        ...

    def reload(self, scaler: Scaler) -> None:
        """Replace the entry read at every spawn."""
        ...

    def ensure_host_ready(self) -> object:
        """Make this host ready for the scaler's spawns (network, bridge, rules base, images),
        idempotently; raises naming what is missing. Asked by the sweeper."""
        ...


def scaler_option(scaler_or_config: Any, key: str, default: Any = None) -> Any:
    """Read a field of a scaler entry (``Scaler.config``) by its ``scalers.yaml`` name.

    ``key`` is the camelCase yaml name (``networkIsolation``), the spelling the importer stores.
    Returns ``default`` when absent or None.
    """
    config = scaler_or_config.config if hasattr(scaler_or_config, "config") else scaler_or_config
    value = (config or {}).get(key)
    return default if value is None else value
