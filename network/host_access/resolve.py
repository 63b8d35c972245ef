"""Resolving an agent's host access: the default set and the storage endpoint (SPEC g.2, g.3)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from .grammar import _DOTTED_QUAD

SCHEME_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _url_port(url: str) -> tuple[str | None, int | None, bool] | None:
    """(host, port, explicit) for a URL, or None when it does not parse or its scheme has no default port."""
    try:
        parts = urlsplit(url.strip())
        explicit = parts.port
    except (ValueError, AttributeError):
        return None
    if explicit is not None:
        if explicit == 0:
            return None
        return parts.hostname, explicit, True
    implied = SCHEME_PORTS.get(parts.scheme.lower())
    if implied is None or not parts.netloc:
        return None
    return parts.hostname, implied, False


def _ip_literal(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not host:
        return None
    if _DOTTED_QUAD.fullmatch(host):
        try:
            return ipaddress.IPv4Address(host)
        except ValueError:
            return None
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return None


def agent_facing_storage_url(
    storage_type: str | None,
    *,
    external_endpoint: str | None = None,
    endpoint: str | None = None,
    fs_base_url: str | None = None,
    console_port: int | str | None = None,
) -> str | None:
    """The storage URL a scaled agent dials (SPEC g.2), from the storage settings.

    ``s3``: ``external_endpoint`` (KICI_STORAGE_EXTERNAL_ENDPOINT) else ``endpoint``
    (KICI_STORAGE_ENDPOINT); ``filesystem``: ``fs_base_url`` (KICI_STORAGE_FS_BASE_URL) else
    ``http://127.0.0.1:<console_port>`` (KICI_PORT); anything else, or nothing set: ``None``.
    """
    kind = (storage_type or "").strip().lower()
    if kind == "s3":
        return external_endpoint or endpoint or None
    if kind == "filesystem":
        if fs_base_url:
            return fs_base_url
        if console_port not in (None, ""):
            return f"http://127.0.0.1:{console_port}"
    return None


def storage_host_access_entries(storage_url: str | None) -> list[str]:
    """Host-access entries for the agent-facing storage endpoint (SPEC g.2, seed host-access.d.ts).

    ``storage_url``: the URL agents dial (see :func:`agent_facing_storage_url`), or ``None``.
    Returns ``["<ip>:<port>"]`` when the host is an IP literal (port explicit or implied by the
    scheme: http/ws 80, https/wss 443; IPv6 literals come back bracketed), ``["*:<port>"]`` for a
    name with an explicit port, and ``[]`` for a name without a port (a remote endpoint reached
    through forward, which no input rule governs), an unknown scheme without a port, ``None``, or
    an unparseable URL. Never raises.
    """
    if not storage_url or not isinstance(storage_url, str):
        return []
    parsed = _url_port(storage_url)
    if parsed is None:
        return []
    host, port, explicit = parsed
    literal = _ip_literal(host)
    if isinstance(literal, ipaddress.IPv4Address):
        return [f"{literal}:{port}"]
    if isinstance(literal, ipaddress.IPv6Address):
        return [f"[{literal}]:{port}"]
    if explicit:
        return [f"*:{port}"]
    return []


def _policy_host_access(policy: Any) -> list[str] | None:
    if policy is None:
        return None
    if isinstance(policy, dict):
        if "host_access" in policy:
            value = policy["host_access"]
        else:
            value = policy.get("hostAccess")
    else:
        value = getattr(policy, "host_access", None)
    return None if value is None else list(value)


def resolve_agent_host_access(
    policy: Any,
    orchestrator_url: str,
    gateway: str,
    host_services: Iterable[str] | None = None,
) -> list[str]:
    """The ``hostAccess`` list in force for one agent sandbox (SPEC g.3, seed host-access.d.ts).

    ``policy``: the label set's network policy (an object with ``host_access``, a dict with
    ``host_access``/``hostAccess``, or ``None``). An explicit list, even ``[]``, wins outright and
    is returned verbatim. Otherwise the default: ``<gateway>:53`` (DNS on the bridge gateway),
    ``*:<console port>`` (explicit or scheme-implied; omitted when ``orchestrator_url`` does not
    parse or has an unknown scheme), then ``host_services`` (e.g. from
    :func:`storage_host_access_entries`), de-duplicated keeping the first occurrence.
    Returns entry strings; they are not parsed here (the renderer parses and refuses bad ones).
    """
    explicit = _policy_host_access(policy)
    if explicit is not None:
        return explicit
    gw = str(gateway).strip()
    try:
        if isinstance(ipaddress.ip_address(gw), ipaddress.IPv6Address):
            gw = f"[{gw}]"
    except ValueError:
        pass
    candidates = [f"{gw}:53"]
    parsed = _url_port(orchestrator_url) if isinstance(orchestrator_url, str) else None
    if parsed is not None:
        candidates.append(f"*:{parsed[1]}")
    candidates.extend(host_services or ())
    seen: set[str] = set()
    resolved = []
    for item in candidates:
        if item not in seen:
            seen.add(item)
            resolved.append(item)
    return resolved
