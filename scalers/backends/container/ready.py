"""What every container spawn of this host needs in place before its create, checked once for all
of them: the agent network's id and bridge on a runtime, and the guard on that bridge in the
scaler's nft tables. Kept in the console's Redis per host, since each spawn runs in a work-horse
that dies with its job; what drops each fact: docs/container-spawn.md ("Checked once"). A Redis
that cannot be read or written costs the checks, never a spawn.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import redis
from django.conf import settings

from ..docker_net import ensure_isolated_network, network_bridge_name

log = logging.getLogger(__name__)

#: Seconds a written guard is trusted by every spawn of the host before one writes it again (the
#: drift check repairs it in between).
GUARD_CHECK_SECONDS = 60.0

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    """This process's client of the console's Redis (its pool reconnects after a fork)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def _recall(key: str) -> str | None:
    try:
        value = _redis().get(key)
    except redis.RedisError as exc:
        log.info("spawn facts: cannot read %s, checking again: %s", key, exc)
        return None
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _remember(key: str, value: str, seconds: float | None = None) -> None:
    try:
        _redis().set(key, value, px=int(seconds * 1000) if seconds else None)
    except redis.RedisError as exc:
        log.info("spawn facts: cannot write %s: %s", key, exc)


def _network_key(runtime_key: str) -> str:
    return f"kici:spawn-facts:{settings.KICI_HOST_NAME}:network:{runtime_key}"


def _guard_key(table: str, netns: str | None, bridge: str) -> str:
    return f"kici:spawn-facts:{settings.KICI_HOST_NAME}:guard:{netns or ''}:{table}:{bridge}"


@dataclass(frozen=True)
class AgentNetwork:
    """``kici-agent-net`` on one runtime: its id, and its Linux bridge ("" for a remote runtime,
    whose bridge this host cannot reach)."""

    id: str
    bridge: str


def agent_network(docker, runtime_key: str, *, local: bool) -> AgentNetwork:
    """The agent network of the runtime ``runtime_key`` (its base URL) as this host recorded it,
    else found (made when missing: ``docker_net.ensure_isolated_network``) and its bridge inspected
    now, then recorded. ``local``: the runtime is this host's, so its bridge is wanted. Raises the
    SDK's errors and ``IsolatedNetworkError``."""
    key = _network_key(runtime_key)
    recorded = _recall(key)
    if recorded:
        facts = json.loads(recorded)
        if not local or facts.get("bridge"):
            return AgentNetwork(facts["id"], facts.get("bridge", "") if local else "")
    net_id = ensure_isolated_network(docker)
    bridge = network_bridge_name(docker, net_id) if local else ""
    _remember(key, json.dumps({"id": net_id, "bridge": bridge}))
    return AgentNetwork(net_id, bridge)


def forget_agent_network(runtime_key: str) -> None:
    """Drop the record of the runtime's agent network (a create found it gone)."""
    try:
        _redis().delete(_network_key(runtime_key))
    except redis.RedisError as exc:
        log.info("spawn facts: cannot forget the network of %s: %s", runtime_key, exc)


def guard_in_force(table: str, netns: str | None, bridge: str, handles: str) -> bool:
    """Whether a process of this host wrote the base and the guard on ``bridge`` into ``table``
    (in ``netns``) less than :data:`GUARD_CHECK_SECONDS` ago, and the tables it wrote them into
    are still the ones the kernel has (``handles``: ``NftClient.table_handles`` now; "" when one
    is missing, which is never in force)."""
    return bool(handles) and _recall(_guard_key(table, netns, bridge)) == handles


def guard_written(table: str, netns: str | None, bridge: str, handles: str, seconds: float) -> None:
    """Record that the base and the guard on ``bridge`` were just written into the tables that
    now read ``handles``, for ``seconds`` (0: not at all)."""
    if handles and seconds > 0:
        _remember(_guard_key(table, netns, bridge), handles, seconds)


def forget_spawn_facts() -> None:
    """Drop every fact this host recorded (tests that remove the network or the tables)."""
    try:
        client = _redis()
        keys = list(client.scan_iter(match=f"kici:spawn-facts:{settings.KICI_HOST_NAME}:*", count=500))
        if keys:
            client.delete(*keys)
    except redis.RedisError as exc:
        log.info("spawn facts: cannot forget them: %s", exc)
