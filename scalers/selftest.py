"""The agent page's live isolation self-test: from an Agent row to ``network.selftest``. Finds the
agent's namespace, rebuilds its rule spec from what is stored, picks the canaries, reads its rules
back from the kernel and sets up the route guard; no packet can leave this machine (docs/nft-isolation.md,
"The isolation self-test").
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from django.conf import settings

from agents.choices import ACTIVE_STATES
from agents.models import Agent
from network.host_access import console_port
from network.netlink import NetlinkError, host_addresses
from network.nft import apply
from network.nft.spec import AgentSpec
from network.probe_guard import ProbeGuard, ProbeGuardError
from network.selftest import default_selftest_targets, run_isolation_selftest

from .backends.isolation import nft_table_for
from .backends.runtime import docker_client_for, runtime_for_scaler
from .backends.spawn_env import console_url
from .models import ConfigState

OTHER_AGENT_SAMPLE = 4

#: Running the live isolation self-test sends probe packets from inside the agent's namespace:
#: an operator's action (the "operators" group of operations.roles has request_operation).
SELFTEST_PERMS = ("operations.request_operation", "agents.change_agent")


def can_run_selftest(user) -> bool:
    """Operators (``operations.request_operation``) or users with ``agents.change_agent``."""
    return any(user.has_perm(p) for p in SELFTEST_PERMS)


class SelftestUnavailable(RuntimeError):
    """The self-test cannot run for this agent; the message says why (shown on the page)."""


@dataclass(frozen=True)
class IsolationContext:
    """Where an agent's rules live: nft ``table``, bridge ``gateway``, and the
    host network namespace holding the bridge and the table (``netns``; None: this process's)."""

    table: str
    gateway: str
    netns: str | None = None


def isolation_context(agent: Agent) -> IsolationContext:
    """Table and gateway of ``agent``'s isolation rules: the firecracker block for VMs, else the
    scaler's ``nftTable`` (or ``KICI_NFT_TABLE``) on ``kici-agent-net`` (gateway 172.30.0.1)."""
    scaler = agent.scaler
    if scaler.type == "firecracker":
        block = ConfigState.load().firecracker or {}
        netns = getattr(settings, "KICI_FIRECRACKER_NETNS", None) or None
        return IsolationContext(str(block.get("table") or "kici"), str(block.get("gateway") or "10.0.0.1"), netns)
    return IsolationContext(nft_table_for(scaler), "172.30.0.1")


def agent_namespace(agent: Agent) -> str | int:
    """The namespace to probe from: ``backend_context["netns"]`` (a named namespace) or
    ``["pid"]``, else a container's init pid from docker. Raises :class:`SelftestUnavailable`."""
    ctx = agent.backend_context or {}
    if ctx.get("netns"):
        return str(ctx["netns"])
    if ctx.get("pid"):
        return int(ctx["pid"])
    if agent.scaler.type == "container" and agent.managed_id:
        try:
            container = docker_client_for(runtime_for_scaler(agent.scaler)).containers.get(agent.managed_id)
        except Exception as exc:  # noqa: BLE001 - docker down, container gone: say so
            raise SelftestUnavailable(f"could not find container {agent.managed_id[:12]}: {exc}") from None
        pid = (container.attrs.get("State") or {}).get("Pid") or 0
        if not pid:
            raise SelftestUnavailable(f"container {agent.managed_id[:12]} is not running")
        return int(pid)
    raise SelftestUnavailable(
        f"no network namespace is known for this {agent.scaler.type} agent "
        "(a VM is probed from a namespace the backend records as backend_context.netns)"
    )


def agent_spec(agent: Agent, gateway: str):
    """The agent's rule spec from its stored host access and its label set's network policy."""
    policy = dict(((agent.label_set.config if agent.label_set else None) or {}).get("networkPolicy") or {})
    return AgentSpec.build(
        agent.ip or "",
        gateway,
        allowlist=list(policy.get("allowlist") or []),
        deny_all=bool(policy.get("denyAll", False)),
        host_access=list(agent.host_access or []),
    )


def run_agent_selftest(agent: Agent, *, timeout: float = 1.0) -> list:
    """Run the self-test for ``agent``; returns ``network.selftest.ProbeResult`` rows in target
    order. Raises :class:`SelftestUnavailable` (no namespace, no address, no interface holds the
    gateway, the rules cannot be read) or what ``run_isolation_selftest`` raises
    (``RuntimeError`` when the namespace cannot be joined)."""
    if not agent.ip:
        raise SelftestUnavailable("the agent has no address yet")
    ctx = isolation_context(agent)
    spec = agent_spec(agent, ctx.gateway)
    others = [
        ip
        for ip in (
            Agent.objects.filter(scaler__type=agent.scaler.type, state__in=ACTIVE_STATES, ip__isnull=False)
            .exclude(pk=agent.pk)
            .values_list("ip", flat=True)[:OTHER_AGENT_SAMPLE]
        )
        if ip
    ]
    try:
        addresses = [str(a) for a in host_addresses(netns=ctx.netns)]
    except NetlinkError as exc:
        raise SelftestUnavailable(f"could not list this host's addresses: {exc}") from None
    port = console_port(console_url(agent.scaler))
    targets = default_selftest_targets(spec, other_agents=others, console_port=port, host_addresses=addresses)
    namespace = agent_namespace(agent)
    try:
        guard = ProbeGuard.for_gateway(agent.ip, ctx.gateway, ctx.netns)
    except ProbeGuardError as exc:
        raise SelftestUnavailable(f"no probe is sent without a route check, and it cannot be set up: {exc}") from None
    client = apply.NftClient(ctx.table, netns=ctx.netns)
    try:
        rules = client.list_agents().get(ipaddress.ip_address(agent.ip))
        sets = client.list_address_sets()
    except apply.NftError as exc:
        raise SelftestUnavailable(f"could not read table inet {ctx.table}: {exc}") from None
    return run_isolation_selftest(namespace, targets, timeout=timeout, guard=guard, rules=rules, sets=sets)
