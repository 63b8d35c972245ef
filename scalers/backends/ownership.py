"""Who owns a sandbox: the installation, the console instance and the scaler that made it. A sweep
counts a sandbox as its own only when all three labels equal its own (:func:`judge_ownership`);
one with a missing or empty owner label is logged and spared, never reaped. Why and the labels:
docs/sandbox-ownership.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from scalers.models import Installation

INSTALLATION_LABEL = "kici-installation-id"
INSTANCE_LABEL = "kici-instance-id"
SCALER_LABEL = "kici-scaler-name"
#: The labels that must all match for a sandbox to be this console's.
OWNER_LABELS = (INSTALLATION_LABEL, INSTANCE_LABEL, SCALER_LABEL)

MINE = "mine"
OTHER = "other"
UNKNOWN = "unknown"
#: How the plan names a sandbox whose owner labels are missing or empty.
UNKNOWN_REASON = "skipped: ownership unknown"


@dataclass(frozen=True)
class Owner:
    """One console's claim on the sandboxes of one scaler."""

    installation_id: str
    instance_id: str
    scaler_name: str

    def labels(self) -> dict[str, str]:
        """The three ownership labels, by name."""
        return {
            INSTALLATION_LABEL: self.installation_id,
            INSTANCE_LABEL: self.instance_id,
            SCALER_LABEL: self.scaler_name,
        }


def current_owner(scaler_name: str) -> Owner:
    """This console's owner of ``scaler_name``'s sandboxes (the installation row is made on first
    use). Raises database errors."""
    return Owner(Installation.current_id(), settings.KICI_INSTANCE_ID, scaler_name)


@dataclass(frozen=True)
class OwnershipVerdict:
    """``ownership``: :data:`MINE`, :data:`OTHER` or :data:`UNKNOWN`; ``reason``: one line for a
    person ("" when mine)."""

    ownership: str
    reason: str = ""


def judge_ownership(labels: Mapping[str, str] | None, owner: Owner) -> OwnershipVerdict:
    """Whose a sandbox is, from its ``labels`` (container labels or a VM's owner file); pure.

    Unknown when any of :data:`OWNER_LABELS` is missing, empty or not a string; other when one
    differs from ``owner`` (compared exactly: ``ci`` is not ``CI`` nor ``ci ``); else mine.
    """
    labels = labels or {}
    missing = [name for name in OWNER_LABELS if not isinstance(labels.get(name), str) or not labels.get(name)]
    if missing:
        return OwnershipVerdict(UNKNOWN, f"{UNKNOWN_REASON} (no {', '.join(missing)})")
    expected = owner.labels()
    for name in OWNER_LABELS:
        if labels[name] != expected[name]:
            what = {
                INSTALLATION_LABEL: "another installation's",
                INSTANCE_LABEL: "another console's",
                SCALER_LABEL: "another scaler's",
            }[name]
            return OwnershipVerdict(OTHER, f"skipped: {what} ({name}={labels[name]})")
    return OwnershipVerdict(MINE)
