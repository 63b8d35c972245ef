"""Host provisioning for Firecracker scalers when ``autoProvisionHost`` is set: the bridge, IP
forwarding, egress and the isolation table the VMs' rules live in, fail-closed on the
port-isolation probe. The order of the steps and why docker's ``DOCKER-USER`` chain gets two
accepts: docs/firecracker-adapter.md ("Host provisioning")."""

from __future__ import annotations

import json
import logging
import subprocess
from typing import Any

from network import netlink

from ..holders import address_lock, other_holders, read_holders

log = logging.getLogger(__name__)


def _in_netns(argv: list[str], netns: str | None, sudo: bool) -> list[str]:
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return (["sudo", "-n"] if sudo else []) + argv


def default_route_interface(netns: str | None = None, sudo: bool = False) -> str | None:
    """Name of the interface of the IPv4 default route, or None when there is none."""
    proc = subprocess.run(
        _in_netns(["ip", "-j", "route", "show", "default"], netns, sudo), capture_output=True, text=True, timeout=10
    )
    if proc.returncode != 0:
        return None
    try:
        routes = json.loads(proc.stdout or "[]")
    except ValueError:
        return None
    for r in routes:
        if r.get("dev"):
            return r["dev"]
    return None


#: dockerd's chain for the operator's own forwarding rules, jumped to first from ``FORWARD``.
DOCKER_USER = "DOCKER-USER"


def docker_user_rules(bridge: str) -> list[list[str]]:
    """The ``DOCKER-USER`` rules (iptables arguments after the chain) that let the VMs on
    ``bridge`` out and their replies back in, in chain order."""
    return [
        ["-i", bridge, "-j", "ACCEPT"],
        ["-o", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
    ]


def ensure_docker_user_accepts(bridge: str, netns: str | None = None, sudo: bool = False) -> bool:
    """Insert :func:`docker_user_rules` at the top of dockerd's ``DOCKER-USER`` chain (the
    ``iptables`` command: whichever backend, nft or legacy, dockerd's rules live in), each only when
    it is missing. Returns False, changing nothing, when there is no such chain (no dockerd).
    Raises RuntimeError with iptables' message when an insert fails."""

    def iptables(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            _in_netns(["iptables", "-w", "5", *args], netns, sudo), capture_output=True, text=True, timeout=30
        )

    if iptables("-S", DOCKER_USER).returncode != 0:
        return False
    for rule in reversed(docker_user_rules(bridge)):
        if iptables("-C", DOCKER_USER, *rule).returncode == 0:
            continue
        proc = iptables("-I", DOCKER_USER, "1", *rule)
        if proc.returncode != 0:
            raise RuntimeError(f"iptables -I {DOCKER_USER} {' '.join(rule)} failed: {proc.stderr.strip()}")
        log.info("added to %s: %s", DOCKER_USER, " ".join(rule))
    return True


def ensure_host_ready(backend: Any) -> bool:
    """Provision the host for ``backend`` (a ``FirecrackerBackend``); False when autoProvisionHost is off.

    Raises ``network.netlink.BridgePortIsolationUnavailable`` (``bridge port isolation is not
    available on <bridge>``) when the bridge will not isolate ports — the scaler must not run VMs
    then — and NetlinkError/NftError/RuntimeError for other provisioning failures.
    """
    s = backend.settings
    if not s.auto_provision_host:
        return False
    netlink.ensure_bridge(s.bridge_name, f"{s.gateway}/{s.prefix}", netns=s.netns)
    proc = subprocess.run(
        _in_netns(["sysctl", "-w", "net.ipv4.ip_forward=1"], s.netns, s.require_sudo),
        capture_output=True,
        text=True,
        timeout=10,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"enabling net.ipv4.ip_forward failed: {proc.stderr.strip()}")
    backend.nft.ensure_table(guard_interfaces=[s.bridge_name], guard_networks=[s.subnet])
    uplink = default_route_interface(s.netns, s.require_sudo)
    if uplink is None:
        log.warning("no IPv4 default route: VMs of %s get no masquerade and no MSS clamp (no internet)", s.name)
    else:
        backend.nft.ensure_egress(s.cidr, uplink)
    ensure_docker_user_accepts(s.bridge_name, s.netns, s.require_sudo)
    netlink.assert_bridge_port_isolation_supported(s.bridge_name, netns=s.netns)
    reapply_isolation_for_tracked_vms(backend)
    return True


def reapply_isolation_for_tracked_vms(backend: Any) -> int:
    """Re-write the rules of every VM this process tracks that has an IP, in one transaction
    (idempotent: each agent's chains are flushed and refilled). Returns how many VMs.

    A VM whose address another sandbox holds now (another allocation row or active agent row:
    ``scalers.backends.holders``) is skipped with a warning: writing its policy would replace the
    holder's rules. The addresses are locked while they are checked and written.
    """
    s = backend.settings
    vms = []
    for agent_id in sorted(backend.tracked_ids()):
        vm = backend.get(agent_id)
        if vm is not None and vm.ip and not vm.abandoned:
            vms.append(vm)
    with address_lock(*(vm.ip for vm in vms)):
        held = read_holders([vm.ip for vm in vms], allocations=backend.rules.allocation_rows) if vms else {}
        specs = []
        for vm in vms:
            others = other_holders(held.get(str(vm.ip), []), (vm.agent_id,))
            if others:
                log.warning(
                    "rules of %s not re-applied for %s: the address is held by %s",
                    vm.ip,
                    vm.agent_id,
                    ", ".join(map(str, others)),
                )
                continue
            specs.append(backend.rule_spec(vm.ip, vm.label_set, vm.host_access, vm.tap))
        backend.nft.self_heal(specs, guard_interfaces=[s.bridge_name], guard_networks=[s.subnet])
    return len(specs)
