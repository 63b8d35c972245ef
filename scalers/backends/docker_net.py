"""The isolated agent network ``kici-agent-net``: a bridge on 172.30.0.0/16 every agent container joins.

Module-level because both agent-container spawn paths (container backend, bare-metal container
mode) must land on it: a container created anywhere else runs on the runtime's default bridge
with full LAN, RFC1918 and cloud-metadata reach.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from datetime import datetime
from typing import NamedTuple

from docker.errors import APIError, NotFound
from docker.types import IPAMConfig, IPAMPool

from network.nft.names import AGENT_MAC_PREFIX

log = logging.getLogger(__name__)

ISOLATED_NETWORK_NAME = "kici-agent-net"
ISOLATED_NETWORK_SUBNET = "172.30.0.0/16"
ISOLATED_NETWORK_GATEWAY = "172.30.0.1"
#: Prefix of every address the isolated network hands out (rule reaping looks only at these).
ISOLATED_ADDRESS_PREFIX = "172.30."


class IsolatedNetworkError(RuntimeError):
    """The isolated network could neither be found nor created."""


def _api(docker):
    """Accept a ``docker.DockerClient`` or its low-level ``APIClient``."""
    return getattr(docker, "api", docker)


def find_isolated_network(docker) -> dict | None:
    """Return the network summary whose name is EXACTLY ``kici-agent-net``, or ``None``.

    The runtime's name filter matches substrings (``kici-agent-net-old`` would match), so the
    listing is re-checked by exact name.
    """
    for net in _api(docker).networks(names=[ISOLATED_NETWORK_NAME]) or []:
        if net.get("Name") == ISOLATED_NETWORK_NAME:
            return net
    return None


def ensure_isolated_network(docker) -> str:
    """Create or find ``kici-agent-net`` (bridge, IPAM 172.30.0.0/16 gw 172.30.0.1, label
    ``kici-managed: "true"``) and return its id. Idempotent, also against a concurrent creator: a 409
    on create, or a 403 because a concurrent creator holds the subnet ("pool overlaps"), re-lists and
    uses the winner's network. Raises ``IsolatedNetworkError`` when it is still missing after that (or
    a 403 names another network holding the subnet); other ``docker.errors.APIError`` propagate.
    """
    existing = find_isolated_network(docker)
    if existing:
        return existing["Id"]
    api = _api(docker)
    ipam = IPAMConfig(
        driver="default", pool_configs=[IPAMPool(subnet=ISOLATED_NETWORK_SUBNET, gateway=ISOLATED_NETWORK_GATEWAY)]
    )
    try:
        created = api.create_network(
            ISOLATED_NETWORK_NAME,
            driver="bridge",
            ipam=ipam,
            labels={"kici-managed": "true"},
            check_duplicate=True,
        )
        log.info("created isolated network %s (%s)", ISOLATED_NETWORK_NAME, created.get("Id", "")[:12])
        return created["Id"]
    except APIError as exc:
        # 409: the name exists. 403 "pool overlaps": a concurrent creator got past the name
        # check first and holds the subnet. Either way the winner's network is the one to use.
        if exc.status_code not in (409, 403):
            raise
        status, explanation = exc.status_code, exc.explanation
    # The winner may still be committing its network: look again for up to ~2 s.
    for delay in (0, 0.05, 0.1, 0.2, 0.4, 0.8, 0.8):
        time.sleep(delay)
        again = find_isolated_network(docker)
        if again:
            return again["Id"]
    if status == 409:
        raise IsolatedNetworkError(f"network {ISOLATED_NETWORK_NAME} not found after 409 conflict")
    raise IsolatedNetworkError(f"network {ISOLATED_NETWORK_NAME} could not be created: {explanation}")


_network_cache: dict[str, tuple[str, float]] = {}
#: Seconds a found network id is trusted before the next spawn looks again.
NETWORK_CACHE_SECONDS = 60.0


def cached_isolated_network(docker, key: str) -> str:
    """:func:`ensure_isolated_network`, remembered per runtime ``key`` (its base URL) for
    ``NETWORK_CACHE_SECONDS``: spawns skip a list call. A network removed meanwhile makes the
    next create fail loudly (``network kici-agent-net not found``), never attach elsewhere."""
    hit = _network_cache.get(key)
    now = time.monotonic()
    if hit and now - hit[1] < NETWORK_CACHE_SECONDS:
        return hit[0]
    net_id = ensure_isolated_network(docker)
    _network_cache[key] = (net_id, now)
    return net_id


def forget_isolated_network() -> None:
    """Drop the caches (tests that remove the network)."""
    _network_cache.clear()
    _bridge_names.clear()


_bridge_names: dict[str, str] = {}


def network_bridge_name(docker, network_id: str) -> str:
    """The Linux bridge behind a docker network: its ``com.docker.network.bridge.name`` option,
    else docker's default ``br-<first 12 of the id>``. Remembered per network id (a network's
    bridge never changes), so spawns and the drift check inspect it once. Raises the SDK's errors."""
    name = _bridge_names.get(network_id)
    if name is None:
        info = _api(docker).inspect_network(network_id)
        name = (info.get("Options") or {}).get("com.docker.network.bridge.name") or f"br-{info['Id'][:12]}"
        _bridge_names[network_id] = name
    return name


def agent_mac(agent_id: str) -> str:
    """The MAC an agent container gets on ``kici-agent-net``: the agent prefix (locally
    administered) and three bytes of SHA-256(agent id). The bridge table never bridges IPv6 frames
    to or from this prefix."""
    tail = hashlib.sha256(agent_id.encode()).hexdigest()[:6]
    return f"{AGENT_MAC_PREFIX}:{tail[0:2]}:{tail[2:4]}:{tail[4:6]}"


class ContainerNetworkFacts(NamedTuple):
    """What one inspect of a started agent container tells its spawn: its IPv4 address and MAC on
    ``kici-agent-net``, its init pid (0 or None when not running) and when its process started
    (the runtime's ``State.StartedAt``, aware; None when unknown)."""

    ip: str | None
    mac: str | None
    pid: int | None
    started_at: datetime | None = None


def container_network_facts(docker, container_id: str) -> ContainerNetworkFacts:
    """:class:`ContainerNetworkFacts` of a container; all None when it is gone."""
    try:
        info = _api(docker).inspect_container(container_id)
    except NotFound:
        return ContainerNetworkFacts(None, None, None)
    ep = ((info.get("NetworkSettings") or {}).get("Networks") or {}).get(ISOLATED_NETWORK_NAME) or {}
    state = info.get("State") or {}
    return ContainerNetworkFacts(
        ep.get("IPAddress") or None,
        ep.get("MacAddress") or None,
        state.get("Pid") or None,
        runtime_time(state.get("StartedAt")),
    )


_RUNTIME_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?")


def runtime_time(text: str | None) -> datetime | None:
    """A docker API timestamp (RFC 3339, nanoseconds, e.g. ``2026-12-05T08:09:10.123456789Z``) as
    an aware datetime to the microsecond; None for none, docker's zero time or an unreadable one."""
    if not text or text.startswith("0001-"):
        return None
    found = _RUNTIME_TIME.fullmatch(text)
    if found is None:
        return None
    whole, frac, zone = found.groups()
    try:
        return datetime.fromisoformat(f"{whole}.{(frac or '0')[:6]:0<6}{'+00:00' if zone in (None, 'Z') else zone}")
    except ValueError:
        return None


def container_network_ip(docker, container_id: str) -> str | None:
    """IPv4 address of a container on ``kici-agent-net``, or ``None`` when it has none (or is gone)."""
    try:
        info = _api(docker).inspect_container(container_id)
    except NotFound:
        return None
    nets = (info.get("NetworkSettings") or {}).get("Networks") or {}
    ip = (nets.get(ISOLATED_NETWORK_NAME) or {}).get("IPAddress")
    return ip or None


def container_addresses(summary: dict) -> list[str]:
    """Addresses a container summary holds or has reserved on ``kici-agent-net`` (dynamic and static)."""
    nets = (summary.get("NetworkSettings") or {}).get("Networks") or {}
    ep = nets.get(ISOLATED_NETWORK_NAME) or {}
    out = []
    if ep.get("IPAddress"):
        out.append(ep["IPAddress"])
    static = (ep.get("IPAMConfig") or {}).get("IPv4Address")
    if static and static not in out:
        out.append(static)
    return out
