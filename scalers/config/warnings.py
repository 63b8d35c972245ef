"""Warnings about a valid ``scalers.yaml``: settings that are accepted but have no effect.

- A bare-metal label set that runs a host process (``binaryPath``) and declares a
  ``networkPolicy``: nothing can enforce a policy on a host process (an ``image``-only label set
  runs in container mode, where it is enforced, and is not warned about).
- ``networkIsolation: false`` on a bare-metal entry: its container mode always runs on
  ``kici-agent-net`` with isolation rules, so the setting is ignored.
- ``netRaw: true`` where no container runs the agent (a Firecracker guest, whose root holds
  every capability inside its VM; a bare-metal host process): there is nothing to give back.
  Where it does take effect the scaler page shows it as a warning instead.
- ``debugHold.onFailure: true`` on an event scaler: its machines are the provisioner's, ended by
  the event-provision reaper; the console holds only sandboxes it made (``scalers.holds``).
- ``kiciAgent`` on a bare-metal label set: the real KiCI agent, scaler-managed and run as root,
  appends an ``iptables`` OUTPUT rule (dropping the metadata address) to the host itself, one per
  agent and never removed; its ``binaryPath`` should drop privileges (docs/real-kici-agent.md).

``import_scalers --check`` (``make check``) prints them; an import records each new one as a
``config.warning`` event and a log line (``scalers.importing``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .schema import ScalersConfig


@dataclass(frozen=True)
class ConfigWarning:
    """One warning: the scaler it concerns, the dotted path of the setting from the entry
    (``labelSets.0.networkPolicy``) and the message naming scaler and setting."""

    scaler: str
    path: str
    message: str


def entry_warnings(entry: Mapping[str, Any]) -> list[ConfigWarning]:
    """The warnings of one ``scalers[]`` entry with its YAML key names (``ScalerEntry.to_raw()``,
    as stored in ``Scaler.config``). Pure."""
    name = str(entry.get("name") or "")
    out = []
    for i, ls in enumerate(entry.get("labelSets") or []):
        if ls.get("netRaw") and (entry.get("type") == "firecracker" or ls.get("binaryPath")):
            out.append(
                ConfigWarning(
                    name,
                    f"labelSets.{i}.netRaw",
                    f'Scaler "{name}" label set [{i}] runs no agent container: netRaw has no effect',
                )
            )
        if (ls.get("debugHold") or {}).get("onFailure") and entry.get("type") == "event":
            out.append(
                ConfigWarning(
                    name,
                    f"labelSets.{i}.debugHold",
                    f'Event scaler "{name}" label set [{i}] provisions machines the console does not hold: '
                    "debugHold has no effect",
                )
            )
    if entry.get("type") != "bare-metal":
        return out
    if entry.get("networkIsolation") is False:
        out.append(
            ConfigWarning(
                name,
                "networkIsolation",
                f'Bare-metal scaler "{name}": networkIsolation: false is ignored; its container-mode agents '
                "always run on kici-agent-net with isolation rules",
            )
        )
    for i, ls in enumerate(entry.get("labelSets") or []):
        if ls.get("kiciAgent"):
            out.append(
                ConfigWarning(
                    name,
                    f"labelSets.{i}.kiciAgent",
                    f'Bare-metal scaler "{name}" label set [{i}] runs the real KiCI agent on the host: run as '
                    "root it appends an iptables OUTPUT rule to this host per agent (never removed); let "
                    "its binaryPath drop privileges",
                )
            )
        if ls.get("binaryPath") and ls.get("networkPolicy"):
            out.append(
                ConfigWarning(
                    name,
                    f"labelSets.{i}.networkPolicy",
                    f'Bare-metal scaler "{name}" label set [{i}] runs a host process (binaryPath): its '
                    "networkPolicy is not enforced",
                )
            )
    return out


def config_warnings(config: ScalersConfig) -> list[tuple[str, ConfigWarning]]:
    """Every warning of ``config`` with its path from the document root (``scalers.2.networkIsolation``)."""
    return [
        (f"scalers.{i}.{w.path}", w) for i, entry in enumerate(config.scalers) for w in entry_warnings(entry.to_raw())
    ]
