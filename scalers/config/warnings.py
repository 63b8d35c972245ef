"""Warnings about a valid ``scalers.yaml``: settings that are accepted but have no effect. Never
blocking: ``import_scalers --check`` prints them and an import records each new one. Each setting
and why it cannot take effect: docs/configuration.md ("Settings accepted without effect are warned
about").
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
