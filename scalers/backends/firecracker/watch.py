"""The spawns this process is running, and the agent-row checks the adapter makes.

The Firecracker backend's boot watcher and log tail are threads of the process that runs
``spawn``; they live only while the spawn call runs (the adapter hands the VM over when it
returns). This module holds the per-process registry of those spawns (:func:`track`,
:func:`untrack`, :func:`live`), the agent-row check a backend of the product asks before it
abandons a booted VM (:func:`boot_over`) and the serial tail attached to failures.
"""

from __future__ import annotations

import os
import threading
from collections import deque

from agents.models import Agent
from consolelog.cap import read_end

from .backend import FirecrackerBackend
from .jail import open_vm_file

#: Serial-console lines attached to a ``scaler.failed`` detail.
CAPTURED_LINES = 50
#: Seconds between two looks at the agent row while a spawn runs (deadline, cancellation).
POLL_SECONDS = 0.2
#: Agent-row states in which a booted VM is no longer the spawn's to fail: registered
#: (``running``/``draining``), or ended by another path (``destroying``/``destroyed``/``failed``).
BOOT_OVER_STATES = ("running", "draining", "destroying", "destroyed", "failed")

_LIVE: dict[str, FirecrackerBackend] = {}
_LIVE_LOCK = threading.Lock()


def track(agent_id: str, backend: FirecrackerBackend) -> None:
    """Record that ``backend`` (in this process) watches the boot of ``agent_id``."""
    with _LIVE_LOCK:
        _LIVE[agent_id] = backend


def untrack(agent_id: str, backend: FirecrackerBackend) -> None:
    """Forget ``agent_id`` if ``backend`` is the one watching it."""
    with _LIVE_LOCK:
        if _LIVE.get(agent_id) is backend:
            del _LIVE[agent_id]


def live(agent_id: str) -> FirecrackerBackend | None:
    """The backend instance of this process watching ``agent_id``'s boot, or None."""
    with _LIVE_LOCK:
        return _LIVE.get(agent_id)


def agent_state(agent_id: str) -> str | None:
    """The agent row's state (``agents.choices.AgentState`` value), None when there is no row."""
    return Agent.objects.filter(agent_id=agent_id).values_list("state", flat=True).first()


def boot_over(agent_id: str) -> bool:
    """True when the agent row says the boot of ``agent_id`` is over (:data:`BOOT_OVER_STATES`):
    its VM is then left alone (no ``scaler.failed``, no cleanup) and its watcher stops."""
    return agent_state(agent_id) in BOOT_OVER_STATES


def serial_tail(path: str | os.PathLike, lines: int = CAPTURED_LINES) -> list[str]:
    """The last ``lines`` non-blank lines of a serial log (read from its last 64 KiB, through
    ``jail.open_vm_file``); [] when unreadable or refused (a link in its place)."""
    try:
        fd = open_vm_file(path, os.O_RDONLY)
    except OSError:
        return []
    try:
        data = read_end(fd, 65536)
    except OSError:
        return []
    finally:
        os.close(fd)
    return list(deque((ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()), maxlen=lines))
