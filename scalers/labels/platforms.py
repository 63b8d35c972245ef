"""Operating system and architecture: this host's, their ``kici:os:*``/``kici:arch:*`` labels and the
taints of a declared platform or of plain labels (ENG, SPEC (b))."""

from __future__ import annotations

import platform as _platform
import sys
from collections.abc import Iterable
from typing import Protocol

#: Plain (un-prefixed) labels that taint a label set when declared in it: a job must
#: name them to land there. ENG denylist, SPEC (b). Linux and x64 never taint.
PLAIN_TAINT_LABELS: frozenset[str] = frozenset({"windows", "win32", "macos", "darwin", "arm64", "aarch64", "arm"})


class PlatformLike(Protocol):
    os: str
    arch: str


def host_os() -> str:
    """This machine's OS in the config vocabulary: ``linux``, ``macos`` or ``windows``
    (other platforms are reported by their ``sys.platform`` name)."""
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform == "darwin":
        return "macos"
    if sys.platform in ("win32", "cygwin"):
        return "windows"
    return sys.platform


def host_arch() -> str:
    """This machine's CPU architecture in the config vocabulary: ``x64`` or ``arm64``
    (others are reported lower-cased as ``platform.machine()`` gives them)."""
    machine = _platform.machine().lower()
    if machine in ("x86_64", "amd64", "x64"):
        return "x64"
    if machine in ("aarch64", "arm64"):
        return "arm64"
    return machine


def os_arch_labels(os_name: str, arch: str) -> list[str]:
    """``kici:os:*`` / ``kici:arch:*`` labels for an OS and arch (ENG, SPEC b).

    linux ⇒ ``kici:os:linux``; macos/darwin ⇒ ``kici:os:macos``, ``kici:os:darwin``;
    windows/win32 ⇒ ``kici:os:windows``, ``kici:os:win32``; x64 ⇒ ``kici:arch:x64``,
    ``kici:arch:amd64``; arm64 ⇒ ``kici:arch:arm64``. Unknown values map to
    ``kici:os:<value>`` / ``kici:arch:<value>``.
    """
    os_name = os_name.lower()
    arch = arch.lower()
    if os_name in ("macos", "darwin"):
        out = ["kici:os:macos", "kici:os:darwin"]
    elif os_name in ("windows", "win32"):
        out = ["kici:os:windows", "kici:os:win32"]
    else:
        out = [f"kici:os:{os_name}"]
    if arch in ("x64", "amd64", "x86_64"):
        out += ["kici:arch:x64", "kici:arch:amd64"]
    elif arch in ("arm64", "aarch64"):
        out += ["kici:arch:arm64"]
    else:
        out += [f"kici:arch:{arch}"]
    return out


def platform_to_taints(platform: PlatformLike | None) -> list[str]:
    """Taints of a declared ``platform`` (ENG ``platformToTaints``, SPEC b).

    Non-linux OS ⇒ the OS name (``macos`` / ``windows``); arm64 ⇒ ``arm64``.
    Linux/x64 and ``None`` ⇒ ``[]``.
    """
    if platform is None:
        return []
    out = []
    if platform.os != "linux":
        out.append(platform.os)
    if platform.arch == "arm64":
        out.append("arm64")
    return out


def plain_taints(labels: Iterable[str]) -> list[str]:
    """Plain taint tokens present in ``labels`` (lower-cased, first-seen order), SPEC (b)."""
    out: list[str] = []
    for label in labels:
        label = label.strip().lower()
        if label in PLAIN_TAINT_LABELS and label not in out:
            out.append(label)
    return out
