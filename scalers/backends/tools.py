"""The host tools a scaler needs before it may start, and the check the sweeper runs each round.
:func:`required_tools_for` names them per type (the reference's ``requiredToolsFor``);
:func:`check_host_tools` stores what is missing on the scaler (``Scaler.host_tools_missing``),
which admission reads: a scaler with missing tools is not started. The tools per type and why
each: docs/configuration.md ("A scaler whose host tools are missing is not started").
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from agents.choices import EventType
from agents.events import record_event
from scalers.admission.matching import not_started_reason
from scalers.choices import ScalerType
from scalers.models import Scaler

from .base import scaler_option
from .spawn_env import FORWARD_PREFIX, label_set_option

log = logging.getLogger(__name__)

#: Where ``mkfs.ext4`` is also looked for (``firecracker.jail`` does the same: sbin is often off PATH).
SBIN_PATH = "/usr/sbin:/sbin"
#: Bytes of a ``binaryPath`` read for its ``#!`` line.
SHEBANG_BYTES = 256


@dataclass(frozen=True)
class ToolRequirement:
    """One tool a scaler needs: ``command`` is a path (contains ``/``: must be an executable
    file) or a bare name (looked up on ``PATH``, then ``fallback_path`` when given); ``purpose``
    says who needs it (``jailerPath``, ``label set [0] binaryPath``, ``overlay drive``)."""

    command: str
    purpose: str
    fallback_path: str | None = None

    def problem(self) -> str | None:
        """Why the tool is unusable here (``jailer /opt/fc/jailer (jailerPath): no such file``),
        or None when it is present."""
        if not self.command:
            return f"{self.purpose}: not set"
        if "/" in self.command:
            if not os.path.exists(self.command):
                why = "no such file"
            elif not os.path.isfile(self.command):
                why = "not a file"
            elif not os.access(self.command, os.X_OK):
                why = "not executable"
            else:
                return None
            return f"{self.command} ({self.purpose}): {why}"
        if shutil.which(self.command) or (self.fallback_path and shutil.which(self.command, path=self.fallback_path)):
            return None
        return f"{self.command} ({self.purpose}): not found on PATH"


def shebang_interpreter(path: str) -> str | None:
    """The interpreter a script's ``#!`` line runs: ``python3`` for ``#!/usr/bin/env python3``
    (``env`` options and ``VAR=value`` words skipped), ``/bin/sh`` for ``#!/bin/sh -e``; None for
    a binary, an unreadable file or a ``#!`` line naming nothing."""
    try:
        with open(path, "rb") as f:
            head = f.read(SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return rest[0] if rest else None
    return words[0]


def _sandboxed(label_set, environ: Mapping[str, str]) -> bool:
    env = label_set_option(label_set, "env") or {}
    value = env.get("KICI_SANDBOX", environ.get(FORWARD_PREFIX + "KICI_SANDBOX", ""))
    return str(value).strip().lower() == "true"


def required_tools_for(scaler: Scaler, *, environ: Mapping[str, str] | None = None) -> list[ToolRequirement]:
    """The tools ``scaler`` needs on this host, in a stable order, each once (see the module
    docstring). Reads its live label sets (a query) and, for a ``binaryPath``, the file's ``#!``
    line. ``environ``: where forwarded ``KICI_AGENT_ENV_*`` come from (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    tools: list[ToolRequirement] = []
    if scaler.type == ScalerType.FIRECRACKER:
        tools += [
            ToolRequirement(str(scaler_option(scaler, "firecrackerPath", "")), "firecrackerPath"),
            ToolRequirement(str(scaler_option(scaler, "jailerPath", "")), "jailerPath"),
            ToolRequirement("mkfs.ext4", "overlay drive", SBIN_PATH),
            ToolRequirement("nft", "VM isolation rules"),
            ToolRequirement("ip", "host networking"),
        ]
        if scaler_option(scaler, "requireSudo", False):
            tools.append(ToolRequirement("sudo", "requireSudo"))
    elif scaler.type == ScalerType.BARE_METAL:
        container_mode = False
        for ls in scaler.label_sets.filter(retired=False).order_by("index"):
            binary = label_set_option(ls, "binaryPath")
            if not binary:
                container_mode = True
                continue
            tools.append(ToolRequirement(str(binary), f"label set [{ls.index}] binaryPath"))
            interpreter = shebang_interpreter(str(binary))
            if interpreter:
                tools.append(ToolRequirement(interpreter, f"interpreter of {binary}"))
            if _sandboxed(ls, environ):
                tools.append(ToolRequirement("bwrap", "KICI_SANDBOX=true"))
        if container_mode and settings.KICI_NETWORK_ISOLATION:
            tools.append(ToolRequirement("nft", "container-mode isolation rules"))
    elif scaler.type == ScalerType.CONTAINER:
        if scaler_option(scaler, "networkIsolation", True) and settings.KICI_NETWORK_ISOLATION:
            tools.append(ToolRequirement("nft", "container isolation rules"))
    unique: dict[str, ToolRequirement] = {}
    for tool in tools:
        unique.setdefault(tool.command, tool)
    return list(unique.values())


#: The bit of CAP_NET_ADMIN in a capability mask (``linux/capability.h``).
CAP_NET_ADMIN = 12


def net_admin_problem(scaler_type: str, status_path: str = "/proc/self/status") -> str | None:
    """Why a ``scaler_type`` scaler cannot run in the process whose ``/proc/<pid>/status`` is
    ``status_path`` (default this one): a Firecracker scaler needs CAP_NET_ADMIN in its effective
    set. None when it has it, or for another type. Raises OSError when the file cannot be read."""
    if scaler_type != ScalerType.FIRECRACKER:
        return None
    with open(status_path) as f:
        eff = next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)
    if eff >> CAP_NET_ADMIN & 1:
        return None
    return (
        "CAP_NET_ADMIN (VM isolation rules and bridge/TAP devices, written by the console itself): "
        "not held; requireSudo does not cover them, run the console as root"
    )


def missing_tools(scaler: Scaler, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per required tool that is unusable here (:meth:`ToolRequirement.problem`), then the
    missing privilege (:func:`net_admin_problem`)."""
    problems = [tool.problem() for tool in required_tools_for(scaler, environ=environ)]
    problems.append(net_admin_problem(scaler.type))
    return [p for p in problems if p]


@dataclass(frozen=True)
class ToolCheck:
    """What :func:`check_host_tools` found: the problems (``missing``, [] = the scaler may start)
    and whether they differ from what the scaler's row held (``changed``)."""

    missing: list[str]
    changed: bool


def check_host_tools(scaler: Scaler, *, environ: Mapping[str, str] | None = None) -> ToolCheck:
    """Check ``scaler``'s tools now and store the result on its row (``host_tools_missing``).

    Only a change is recorded, so a scaler that stays short of a tool is reported once: a
    ``host.tools_missing`` event and a warning naming the tools when the list changes to a
    non-empty one, a ``host.tools_found`` event and an info line when it empties (the row is
    locked and re-read before it is written). ``scaler`` should be freshly loaded. Raises
    database errors.
    """
    missing = missing_tools(scaler, environ=environ)
    if list(scaler.host_tools_missing or []) == missing:  # as loaded: the usual round writes nothing
        return ToolCheck(missing, False)
    with transaction.atomic():
        row = Scaler.objects.select_for_update().filter(pk=scaler.pk).values_list("host_tools_missing", flat=True)
        previous = list(row.first() or [])
        scaler.host_tools_missing = missing
        if previous == missing:
            return ToolCheck(missing, False)
        Scaler.objects.filter(pk=scaler.pk).update(host_tools_missing=missing)
        if missing:
            detail = not_started_reason(scaler.name, missing)
            log.warning("%s", detail)
            record_event(None, EventType.HOST_TOOLS_MISSING, detail, {"missing": missing}, scaler_name=scaler.name)
        else:
            detail = f"scaler {scaler.name}: the host tools it needs are present; starting it"
            log.info("%s", detail)
            record_event(
                None, EventType.HOST_TOOLS_FOUND, detail, {"previously_missing": previous}, scaler_name=scaler.name
            )
    return ToolCheck(missing, True)
