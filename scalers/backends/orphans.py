"""What an orphan sweep plans to remove: one :class:`OrphanTarget` per thing, for every backend.

A plan is made first, shown and approved, then applied; the backend re-checks each target right
before acting on it. The rules deciding what is an orphan are the backends' own
(``scalers.backends.container.orphans``, ``scalers.backends.firecracker.orphans``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class OrphanTarget:
    """One thing the sweep would remove, with the evidence for it; JSON-serialisable (:meth:`to_dict`,
    :meth:`from_dict`), so a plan can be stored, shown and approved. ``kind``/``target``: containers'
    ``container`` (id) or ``rule`` (address); Firecracker's ``allocation`` or ``chroot`` (VM id),
    ``tap`` (interface) or ``rules`` (address). ``scaler``: the sweeping one; ``agent_id``: "" if none;
    ``reason``: one line for a person; ``evidence``: the facts the decision used.
    """

    kind: str
    target: str
    scaler: str
    agent_id: str = ""
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def pass_no(self) -> int:
        """The Firecracker sweep pass (1-4) that planned this target; 0 for a container sweep's."""
        return int(self.evidence.get("pass") or 0)

    @property
    def ip(self) -> str | None:
        """The address a Firecracker target's allocation or rules are for."""
        return self.evidence.get("ip")

    @property
    def tap(self) -> str | None:
        """The TAP interface a Firecracker target names."""
        return self.evidence.get("tap")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OrphanTarget:
        return cls(
            kind=str(data["kind"]),
            target=str(data["target"]),
            scaler=str(data.get("scaler", "")),
            agent_id=str(data.get("agent_id", "")),
            reason=str(data.get("reason", "")),
            evidence=dict(data.get("evidence") or {}),
        )
