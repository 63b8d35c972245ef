"""Per-agent network isolation for agent containers, through ``network.nft.apply.NftClient``.

One :class:`ContainerIsolation` per backend instance: the table is ``nftTable`` on the scaler
entry when set, else ``settings.KICI_NFT_TABLE`` (never a hard-coded table another console
may own). The bridge of ``kici-agent-net`` is guarded (``network.nft.render``): only a bound
container, on its own port, gets past it. Every console on the docker host guards the same bridge
with the same mark bit, so each one's guard passes the others' bound agents.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from network.host_access import (
    ConsoleService,
    Listening,
    resolve_agent_host_access,
    storage_host_access_entries,
)
from network.nft import apply as nft_apply
from network.nft.spec import AgentSpec
from scalers.kici_orchestrator import kici_agent_target

from . import holders
from .base import scaler_option
from .docker_net import ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_SUBNET

log = logging.getLogger(__name__)


def nft_table_for(scaler: Any) -> str:
    """The nft table this scaler's rules live in: entry ``nftTable``, else ``settings.KICI_NFT_TABLE``."""
    return str(scaler_option(scaler, "nftTable") or settings.KICI_NFT_TABLE)


def host_services() -> list[str]:
    """Host-access entries for the console's own object storage (``KICI_STORAGE_URL``), so agents reach it."""
    return storage_host_access_entries(getattr(settings, "KICI_STORAGE_URL", None))


def console_services(listening: Listening | None) -> list[ConsoleService]:
    """The console's own backing services no agent may reach, for the host-access warnings
    (``network.host_access.host_access_warnings``): its PostgreSQL (``DATABASE_URL``), its Redis
    (``REDIS_URL``), both as the console dials them, and each operator listener
    (``KICI_OPERATOR_LISTEN``, where the console listens: a loopback one is out of reach; one with
    port ``*`` has no port to name and is left out) and orchestrator's API listener
    (``KICI_API_LISTEN``). A setting that names no host or port is skipped.
    A service dialed on loopback carries where this host's sockets listen on its port
    (``listening``: ``network.host_access.tcp_listening``, read once by the caller; None when not
    known), so one listening on loopback only is not warned about."""
    services = []

    def dialed(name: str, host: str, port: int) -> ConsoleService:
        try:
            local = ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            local = host == "localhost"
        return ConsoleService(name, host, port, listeners=tuple((listening or {}).get(port, ())) if local else ())

    db = settings.DATABASES.get("default") or {}
    if db.get("HOST"):
        services.append(dialed("PostgreSQL (DATABASE_URL)", str(db["HOST"]), int(db.get("PORT") or 5432)))
    try:
        redis = urlsplit(settings.REDIS_URL)
        if redis.scheme in ("redis", "rediss"):
            services.append(dialed("Redis (REDIS_URL)", redis.hostname or "localhost", redis.port or 6379))
    except ValueError:
        pass
    for host, port in settings.KICI_OPERATOR_LISTEN:
        if port is not None:
            services.append(ConsoleService("operator listener (KICI_OPERATOR_LISTEN)", host, port, exact=True))
    for host, port in settings.KICI_API_LISTEN:
        if port is not None:
            services.append(ConsoleService("orchestrator's API listener (KICI_API_LISTEN)", host, port, exact=True))
    return services


def resolve_host_access(
    policy: Any, orchestrator_url: str, gateway: str = ISOLATED_NETWORK_GATEWAY
) -> tuple[list[str], bool]:
    """``(entries, explicit)``: the label set's explicit ``hostAccess`` verbatim, else the
    default (gateway DNS, the console port, host services)."""
    explicit = isinstance(policy, dict) and (
        policy.get("hostAccess") is not None or policy.get("host_access") is not None
    )
    return resolve_agent_host_access(policy, orchestrator_url, gateway, host_services()), explicit


def resolve_kici_host_access(policy: Any, target, gateway: str = ISOLATED_NETWORK_GATEWAY) -> tuple[list[str], bool]:
    """``(entries, explicit)`` for a sandbox running the real KiCI agent of ``target``
    (``scalers.kici_orchestrator.KiciAgentTarget``): the label set's explicit ``hostAccess``
    verbatim, else the orchestrator's port on the gateway when the orchestrator listens there,
    and nothing more of the host (no DNS, no console port: the real agent talks to its
    orchestrator only). An orchestrator elsewhere is reached through the forward rules, not
    host access: the default is then ``[]``."""
    explicit = isinstance(policy, dict) and (
        policy.get("hostAccess") is not None or policy.get("host_access") is not None
    )
    if explicit:
        return resolve_agent_host_access(policy, "", gateway), True
    return ([f"{gateway}:{target.port}"] if target.host == gateway else []), False


def label_set_host_access(label_set, host_access: list[str] | None, orchestrator_url: str, gateway: str) -> list[str]:
    """The host access agents of ``label_set`` get when its ``hostAccess`` is ``host_access``
    (None = the default): :func:`resolve_kici_host_access` for a label set running the real KiCI
    agent, else :func:`resolve_host_access` with ``orchestrator_url`` (the console agents dial)."""
    policy = {"hostAccess": list(host_access)} if host_access is not None else None
    target = kici_agent_target(label_set)
    if target is not None:
        return resolve_kici_host_access(policy, target, gateway)[0]
    return resolve_host_access(policy, orchestrator_url, gateway)[0]


@dataclass
class IsolationTarget:
    """What the drift check needs of one backend's isolation: the table's ``client`` (an
    ``NftClient``), the ``bridges`` it guards and their IPv4 ``networks``, and ``spec_for(agent)``:
    the rules an active agent must have, rebuilt from its row (address, port, stored host access)
    and its label set's policy, or None when it has no address to key them by."""

    client: Any
    bridges: list[str]
    networks: list[str]
    spec_for: Callable[[Any], AgentSpec | None]


class ContainerIsolation:
    """Writes and removes one console's per-container rules on ``kici-agent-net``.

    ``client``: an ``network.nft.apply.NftClient`` (injected by tests), else one for ``table``.
    """

    def __init__(self, table: str, client: Any = None):
        if client is None:
            client = nft_apply.NftClient(table)
        self.client = client
        self.table = client.table

    def check(self, bridge: str) -> None:
        """Fail closed when nft is unusable, then create the tables with the guard on ``bridge``
        (the agent network's; it must exist). Raises ``NftUnavailableError`` / ``NftError``."""
        self.client.check_available()
        self.client.ensure_table([bridge], [ISOLATED_NETWORK_SUBNET])

    def apply(
        self,
        address: str,
        policy: dict | None,
        host_access: Iterable[str],
        port: str | None = None,
        mac: str | None = None,
    ) -> None:
        """Write forward (gateway accept, allowlist, private drops, denyAll) and input (host access) rules
        for one container address and bind it with its ``mac`` to ``port`` (its veth) in one transaction,
        so its frames pass the guard only once its rules are in force; a previous holder's rules for the
        address are replaced in that transaction. Written under the address's lock
        (``holders.address_lock``: docs/address-holders.md). Raises ``RuleSpecError``/``NftError``.
        """
        spec = self.spec(address, policy, host_access, port, mac)
        with holders.address_lock(str(spec.address)):
            self.client.apply_agent(spec)

    @staticmethod
    def spec(
        address: str, policy: dict | None, host_access: Iterable[str], port: str | None = None, mac: str | None = None
    ) -> AgentSpec:
        """The rules of one container address (gateway, the policy's allowlist and denyAll, the
        resolved host access, its port and MAC there). Raises ``RuleSpecError``."""
        policy = policy or {}
        return AgentSpec.build(
            address,
            ISOLATED_NETWORK_GATEWAY,
            allowlist=list(policy.get("allowlist") or []),
            deny_all=bool(policy.get("denyAll", policy.get("deny_all", False))),
            host_access=list(host_access),
            port=port,
            mac=mac,
        )

    def remove(self, address: str | None) -> bool:
        """Delete one address's rules unconditionally; a missing address or table is a no-op (False).

        Only for an address already known to be unheld; a teardown uses :meth:`remove_unless_held`.
        """
        if not address:
            return False
        return bool(self.client.remove_agent(address))

    def remove_unless_held(
        self, address: str | None, *, exclude: Iterable[str] = (), list_containers: Any = None, why: str = ""
    ) -> tuple[bool, list]:
        """Delete one address's rules unless a sandbox other than ``exclude`` holds the address now
        (``holders.remove_unless_held``: active agent rows, kici-managed containers from
        ``list_containers()``, VM allocations). Returns ``(removed, holders)``; ``holders`` non-empty
        means the rules were kept. Raises ``NftError`` / database errors."""
        removed, held = holders.remove_unless_held(
            address, self.remove, exclude=exclude, list_containers=list_containers, why=why
        )
        return bool(removed), held

    def addresses_with_rules(self) -> list[str] | None:
        """Addresses on the isolated subnet that have rules in this table; None when unreadable."""
        try:
            agents = self.client.list_agents()
        except Exception as exc:  # noqa: BLE001 - a failed read plans nothing
            log.warning("could not list isolation rules in table %s: %s", self.table, exc)
            return None
        net = ipaddress.ip_network(ISOLATED_NETWORK_SUBNET)
        return sorted((str(a) for a in agents if a.version == 4 and a in net), key=lambda s: ipaddress.ip_address(s))

    def reap(self, live_addresses: Iterable[str] | None, only: Iterable[str] | None = None) -> list[str]:
        """Delete rules of addresses on 172.30.0.0/16 that no live container holds; None → nothing.
        ``only``: consider just these addresses (the ones the caller locked and re-checked)."""
        return self.client.reap_unowned_isolation_rules(live_addresses, ISOLATED_NETWORK_SUBNET, only=only)
