"""The output cap: every agent output file a sandbox of this host writes is held to
``KICI_AGENT_OUTPUT_CAP_BYTES`` while the agent runs.

Each sweeper round asks every scaler's backend that has ``output_files()`` (Firecracker: the VMs'
serial consoles and VMM logs; bare metal: the process-mode agents' output files) for its files and
caps each with ``consolelog.cap.cap_file``: a file holding more than the cap keeps its last half (from
a line start), the beginning is freed in place. Container output is bounded by docker's own log
rotation (``scalers.backends.hostconfig.AGENT_LOG_CONFIG``). Design: ``docs/live-streams.md``.
"""

from __future__ import annotations

import logging
import os

from consolelog.cap import cap_file

from .backends import factory
from .choices import ScalerType
from .models import Scaler

log = logging.getLogger(__name__)

#: Files whose cap failed and was already logged (logged again only after it worked once).
_refused: set[str] = set()


def cap_agent_outputs(cap: int) -> int:
    """Cap every output file of this host's sandboxes at ``cap`` bytes; returns the bytes freed.
    A file that is missing is skipped; one that cannot be opened or capped (a link in its place,
    no write access, a filesystem without hole punching) is logged once and skipped."""
    seen: set[str] = set()
    freed = 0
    for scaler in Scaler.objects.on_this_host().exclude(type=ScalerType.EVENT):
        try:
            files: list = getattr(factory.get_backend(scaler), "output_files", list)()
        except Exception as exc:  # noqa: BLE001 - one scaler's configuration must not stop the others
            log.warning("output cap: scaler %s: %s", scaler.name, exc)
            continue
        for path, opener in files:
            key = os.fspath(path)
            if key in seen:
                continue
            seen.add(key)
            freed += _cap_one(key, opener, cap)
    return freed


def _cap_one(path: str, opener, cap: int) -> int:
    try:
        fd = opener(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        return _refuse(path, exc)
    try:
        freed = cap_file(fd, cap)
    except OSError as exc:
        return _refuse(path, exc)
    finally:
        os.close(fd)
    _refused.discard(path)
    if freed:
        log.info("output cap: freed the first %d bytes of %s (cap %d bytes)", freed, path, cap)
    return freed


def _refuse(path: str, exc: OSError) -> int:
    if path not in _refused:
        if len(_refused) >= 10000:  # paths of VMs long gone: forget them, at worst a repeated line
            _refused.clear()
        _refused.add(path)
        log.warning("output cap: %s is not capped: %s", path, exc)
    return 0
