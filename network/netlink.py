"""Bridge and TAP plumbing over netlink (pyroute2), with bridge port isolation: every VM TAP (and, in
tests, every agent veth) is enslaved with ``IFLA_BRPORT_ISOLATED`` on (why: docs/firecracker-adapter.md,
"Addresses and TAP names"). Every public function takes a keyword-only ``netns``, a namespace name
(``/run/netns/<name>``) or ``None`` for the caller's own; the work then runs on a thread that joined
it with ``setns`` (no fork). Kernel errors raise :class:`NetlinkError` naming the interface and the
operation.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError as _PyrNetlinkError

log = logging.getLogger(__name__)

IFNAMSIZ = 15  # bytes, excluding the terminating NUL
TAP_PREFIX = "kici-"
PROBE_TAP = "kici-isoprobe"
_SUFFIX_OK = re.compile(r"[A-Za-z0-9_.\-]+", re.ASCII)


class NetlinkError(RuntimeError):
    """A netlink operation failed; the message names the interface and the operation."""


class BridgePortIsolationUnavailable(NetlinkError):
    """The kernel, or the bridge, refused to isolate a port: VMs must not run (fail closed)."""


_state = threading.local()
#: The kernel's neighbour state "stale": valid, to be confirmed at first use.
NUD_STALE = 0x04


def run_in_netns[T](netns: str, fn: Callable[[], T], path: str | None = None) -> T:
    """Run ``fn`` on a short-lived thread that has joined ``/run/netns/<netns>`` (or the namespace
    file ``path``, e.g. ``/proc/<pid>/ns/net``).

    ``setns`` changes only the calling thread's namespace, so this neither forks (pyroute2's own
    netns support forks, which is unsafe in a threaded server) nor moves the caller. Netlink
    sockets and TAPs created on that thread belong to the namespace.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            fd = os.open(path or f"/run/netns/{netns}", os.O_RDONLY)
        except OSError as exc:
            box["error"] = NetlinkError(f"network namespace {netns} cannot be opened: {exc}")
            return
        try:
            os.setns(fd, os.CLONE_NEWNET)
            _state.netns = netns
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=target, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")  # type: ignore[return-value]


def _netns_aware[T](fn: Callable[..., T]) -> Callable[..., T]:
    """Give ``fn`` a keyword-only ``netns``: run it inside that namespace (None = here)."""

    @functools.wraps(fn)
    def wrapper(*args, netns: str | None = None, **kwargs) -> T:
        if netns is None or getattr(_state, "netns", None) == netns:
            return fn(*args, **kwargs)
        return run_in_netns(netns, lambda: fn(*args, **kwargs))

    return wrapper


def _ipr() -> IPRoute:
    return IPRoute()


def _index(ipr: IPRoute, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return found[0] if found else None


def _where() -> str:
    netns = getattr(_state, "netns", None)
    return f" in netns {netns}" if netns else ""


def validate_ifname(name: str) -> str:
    """Return ``name`` if Linux accepts it as an interface name (1-15 bytes, no ``/``, ``:`` or
    whitespace, not ``.``/``..``); raise ``ValueError`` naming it otherwise."""
    if not isinstance(name, str) or not name or len(name.encode()) > IFNAMSIZ or name in (".", ".."):
        raise ValueError(f"interface name {name!r} must be 1-{IFNAMSIZ} bytes")
    if any(c in name for c in "/:%") or any(c.isspace() for c in name):
        raise ValueError(f"interface name {name!r} contains '/', ':', '%' or whitespace")
    return name


def _hashed_tap_name(agent_id: str) -> str:
    return TAP_PREFIX + "x" + hashlib.sha256(agent_id.encode()).hexdigest()[:9]


def tap_name_for(agent_id: str, in_use: Mapping[str, str] | None = None) -> str:
    """The TAP name for a VM: ``kici-<last 8 characters of the id>`` (``scaler-firecracker-1d993749`` →
    ``kici-1d993749``), or ``kici-x`` + 9 hex digits of SHA-256(id) when those characters are not
    plain or ``in_use`` (TAP name → owning agent id) gives the name to another agent. Deterministic;
    store the result (``tap_device``) rather than derive it again (docs/firecracker-adapter.md,
    "Addresses and TAP names"). Raises ``ValueError`` for an empty id or when even the hashed name is
    another agent's.
    """
    if not isinstance(agent_id, str) or not agent_id:
        raise ValueError(f"agent id {agent_id!r} must be a non-empty string")
    owners = in_use or {}
    suffix = agent_id[-8:]
    if _SUFFIX_OK.fullmatch(suffix) and suffix not in (".", ".."):
        name = TAP_PREFIX + suffix
        if owners.get(name, agent_id) == agent_id:
            return name
    name = _hashed_tap_name(agent_id)
    if owners.get(name, agent_id) != agent_id:
        raise ValueError(f"TAP name {name} for agent {agent_id!r} is held by agent {owners[name]!r}")
    return name


@_netns_aware
def link_names() -> list[str]:
    """Names of every interface in the namespace."""
    with _ipr() as ipr:
        return [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]


@_netns_aware
def host_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address configured on an interface of the namespace (loopback included), sorted,
    each once. Raises NetlinkError when the kernel cannot be asked."""
    try:
        with _ipr() as ipr:
            # IFA_LOCAL is the address itself on point-to-point links, where IFA_ADDRESS is the peer.
            found = {ipaddress.ip_address(a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr()}
    except (_PyrNetlinkError, OSError) as exc:
        raise NetlinkError(f"listing the addresses{_where()} failed: {exc}") from exc
    return sorted(found, key=lambda a: (a.version, a))


@_netns_aware
def host_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The subnets of the namespace's own addresses (its connected networks: ``192.0.2.10/24``
    gives ``192.0.2.0/24``), both families, loopback and IPv6 link-local left out, sorted, each
    once. Raises NetlinkError when the kernel cannot be asked."""
    try:
        with _ipr() as ipr:
            found = set()
            for a in ipr.get_addr():
                local = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
                net = ipaddress.ip_interface(f"{local}/{a['prefixlen']}").network
                if not (net.network_address.is_loopback or net.network_address.is_link_local):
                    found.add(net)
    except (_PyrNetlinkError, OSError) as exc:
        raise NetlinkError(f"listing the addresses{_where()} failed: {exc}") from exc
    return sorted(found, key=lambda n: (n.version, n))


@_netns_aware
def ensure_bridge(name: str, address: str | None = None) -> int:
    """Create bridge ``name`` unless it exists, set it up, and add ``address`` (``10.0.0.1/24``)
    unless already present. Idempotent. Returns the ifindex. Raises NetlinkError, or
    ``ValueError`` for a bad name/address; an existing non-bridge of that name is an error.
    """
    validate_ifname(name)
    iface = ipaddress.ip_interface(address) if address else None
    with _ipr() as ipr:
        idx = _index(ipr, name)
        if idx is None:
            try:
                ipr.link("add", ifname=name, kind="bridge")
            except _PyrNetlinkError as exc:
                if exc.code != 17:  # EEXIST: a concurrent creator won
                    raise NetlinkError(f"creating bridge {name}{_where()} failed: {exc}") from exc
            idx = _index(ipr, name)
            if idx is None:
                raise NetlinkError(f"bridge {name}{_where()} vanished right after it was created")
        link = ipr.get_links(idx)[0]
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info else None
        if kind != "bridge":
            raise NetlinkError(f"{name}{_where()} exists but is a {kind or 'plain'} link, not a bridge")
        if iface is not None:
            have = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=idx, family=_af(iface))}
            if (str(iface.ip), iface.network.prefixlen) not in have:
                try:
                    ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
                except _PyrNetlinkError as exc:
                    if exc.code != 17:
                        raise NetlinkError(f"adding {iface} to {name}{_where()} failed: {exc}") from exc
        ipr.link("set", index=idx, state="up")
        return idx


def _af(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> int:
    return socket.AF_INET if iface.version == 4 else socket.AF_INET6


@_netns_aware
def set_port_isolation(ifname: str, isolated: bool = True) -> None:
    """Set ``IFLA_BRPORT_ISOLATED`` on a bridge port. Raises BridgePortIsolationUnavailable when
    the kernel refuses and NetlinkError when the interface is missing."""
    with _ipr() as ipr:
        idx = _index(ipr, ifname)
        if idx is None:
            raise NetlinkError(f"interface {ifname}{_where()} does not exist")
        try:
            ipr.brport("set", index=idx, isolated=1 if isolated else 0)
        except _PyrNetlinkError as exc:
            raise BridgePortIsolationUnavailable(
                f"setting bridge port isolation on {ifname}{_where()} failed: {exc}"
            ) from exc
    if isolated and not port_isolated(ifname):
        raise BridgePortIsolationUnavailable(
            f"bridge port isolation on {ifname}{_where()} did not take effect (the kernel ignored it)"
        )


@_netns_aware
def port_isolated(ifname: str) -> bool:
    """Whether the bridge port ``ifname`` is isolated, as the kernel reports it now."""
    with _ipr() as ipr:
        idx = _index(ipr, ifname)
        if idx is None:
            raise NetlinkError(f"interface {ifname}{_where()} does not exist")
        for msg in ipr.brport("show", index=idx):
            info = msg.get_attr("IFLA_PROTINFO")
            if info is not None and info.get_attr("IFLA_BRPORT_ISOLATED"):
                return True
    return False


@_netns_aware
def enslave(ifname: str, bridge: str, isolated: bool = True, up: bool = True) -> None:
    """Attach ``ifname`` to ``bridge``, set port isolation (on by default), bring it up.

    Isolation is set before the link comes up, so the port never forwards unisolated. Raises
    NetlinkError / BridgePortIsolationUnavailable; on an isolation failure the link stays down.
    """
    with _ipr() as ipr:
        idx, br = _index(ipr, ifname), _index(ipr, bridge)
        if idx is None:
            raise NetlinkError(f"interface {ifname}{_where()} does not exist")
        if br is None:
            raise NetlinkError(f"bridge {bridge}{_where()} does not exist")
        try:
            ipr.link("set", index=idx, master=br)
        except _PyrNetlinkError as exc:
            raise NetlinkError(f"enslaving {ifname} to {bridge}{_where()} failed: {exc}") from exc
    set_port_isolation(ifname, isolated)
    if up:
        with _ipr() as ipr:
            ipr.link("set", index=_index(ipr, ifname), state="up")


@_netns_aware
def create_tap(name: str, bridge: str, isolated: bool = True, up: bool = True) -> int:
    """Create persistent TAP ``name`` (no packet-info header, as ``ip tuntap add mode tap``),
    enslave it to ``bridge`` isolated, bring it up. Returns the ifindex.

    On any failure after creation the TAP is deleted again, so a half-plumbed, unisolated TAP is
    never left behind. Raises NetlinkError / BridgePortIsolationUnavailable.
    """
    validate_ifname(name)
    with _ipr() as ipr:
        try:
            ipr.link("add", ifname=name, kind="tuntap", mode="tap", ifr={"no_pi": True})
        except (_PyrNetlinkError, OSError) as exc:
            raise NetlinkError(f"creating TAP {name}{_where()} failed: {exc}") from exc
        idx = _index(ipr, name)
    if idx is None:
        raise NetlinkError(f"TAP {name}{_where()} was not created")
    try:
        enslave(name, bridge, isolated=isolated, up=up)
    except Exception:
        delete_link(name)
        raise
    return idx


def _peer_index(pid: int, mac: str) -> int:
    """In process ``pid``'s network namespace: the peer ifindex of the veth whose MAC is ``mac``."""

    def find() -> int:
        with _ipr() as ipr:
            for link in ipr.get_links():
                if (link.get_attr("IFLA_ADDRESS") or "").lower() == mac.lower():
                    peer = link.get_attr("IFLA_LINK")
                    if peer:
                        return int(peer)
        raise NetlinkError(f"no veth with MAC {mac} in the network namespace of pid {pid}")

    return run_in_netns(f"pid {pid}", find, path=f"/proc/{pid}/ns/net")


@_netns_aware
def bridge_port_of(pid: int, mac: str, bridge: str) -> str:
    """The name of the port of ``bridge`` whose veth peer, inside process ``pid``'s network
    namespace (a container's), has MAC ``mac``: the port that container's frames arrive on.

    Raises :class:`NetlinkError` when the process has no such interface or its peer is not a
    port of ``bridge``.
    """
    index = _peer_index(pid, mac)
    with _ipr() as ipr:
        bridge_index = _index(ipr, bridge)
        try:
            links = ipr.get_links(index) if bridge_index is not None else []
        except _PyrNetlinkError:
            links = []
    if not links or links[0].get_attr("IFLA_MASTER") != bridge_index:
        raise NetlinkError(f"the veth of pid {pid} (MAC {mac}) is not a port of {bridge}{_where()}")
    return links[0].get_attr("IFLA_IFNAME")


@_netns_aware
def teach_gateway(pid: int, mac: str, gateway: str, bridge: str) -> None:
    """Inside process ``pid``'s network namespace (a container's), on its interface with MAC ``mac``:
    record ``gateway`` (an address of ``bridge``) at the bridge's MAC as a ``stale`` neighbour entry
    (confirmed by the kernel at first use), releasing at once the packets queued behind an ARP request
    the guard dropped before the bridge port was bound (docs/container-spawn.md). Sends nothing.
    Raises :class:`NetlinkError` when the bridge or the interface is missing or the kernel refuses.
    """
    with _ipr() as ipr:
        bridge_index = _index(ipr, bridge)
        links = ipr.get_links(bridge_index) if bridge_index is not None else []
    bridge_mac = links[0].get_attr("IFLA_ADDRESS") if links else None
    if not bridge_mac:
        raise NetlinkError(f"bridge {bridge} not found{_where()}")

    def teach() -> None:
        with _ipr() as ipr:
            index = next(
                (
                    link["index"]
                    for link in ipr.get_links()
                    if (link.get_attr("IFLA_ADDRESS") or "").lower() == mac.lower()
                ),
                None,
            )
            if index is None:
                raise NetlinkError(f"no interface with MAC {mac} in the network namespace of pid {pid}")
            try:
                ipr.neigh("replace", dst=gateway, lladdr=bridge_mac, ifindex=index, state=NUD_STALE)
            except _PyrNetlinkError as exc:
                raise NetlinkError(f"cannot set the neighbour {gateway} in the namespace of pid {pid}: {exc}") from exc

    run_in_netns(f"pid {pid}", teach, path=f"/proc/{pid}/ns/net")


@_netns_aware
def teach_bridge(address: str, mac: str, bridge: str) -> None:
    """On ``bridge``: record ``address`` (a sandbox's, just given to it) at ``mac`` as a ``stale``
    neighbour entry. An address freed by one sandbox and given to the next is otherwise still
    mapped to the old sandbox's MAC, and the host's answers go there until the kernel's probe
    notices, seconds later: the new sandbox learned the gateway's MAC without asking
    (:func:`teach_gateway`), so the host never hears it. Sends nothing. Raises
    :class:`NetlinkError` when the bridge is missing or the kernel refuses."""
    with _ipr() as ipr:
        index = _index(ipr, bridge)
        if index is None:
            raise NetlinkError(f"bridge {bridge} not found{_where()}")
        try:
            ipr.neigh("replace", dst=address, lladdr=mac, ifindex=index, state=NUD_STALE)
        except _PyrNetlinkError as exc:
            raise NetlinkError(f"cannot set the neighbour {address} on {bridge}{_where()}: {exc}") from exc


@_netns_aware
def delete_link(name: str) -> bool:
    """Delete an interface; a missing one is a no-op. Returns True when one was deleted."""
    with _ipr() as ipr:
        idx = _index(ipr, name)
        if idx is None:
            return False
        try:
            ipr.link("del", index=idx)
        except _PyrNetlinkError as exc:
            if exc.code == 19:  # ENODEV: gone meanwhile
                return False
            raise NetlinkError(f"deleting {name}{_where()} failed: {exc}") from exc
    return True


@_netns_aware
def assert_bridge_port_isolation_supported(bridge: str, probe: str = PROBE_TAP) -> bool:
    """End-to-end probe that ``bridge`` will isolate ports.

    Creates TAP ``kici-isoprobe``, enslaves it isolated, reads the flag back, deletes it.
    Returns True when isolation works. Returns False (with a warning) when the probe TAP cannot be
    created at all, which says nothing about isolation. Raises BridgePortIsolationUnavailable
    (``bridge port isolation is not available on <bridge>: ...``) when the TAP exists but cannot be
    isolated, or the bridge is missing: refuse to run VMs rather than run them unisolated.
    """
    delete_link(probe)  # a leftover from a crashed probe
    with _ipr() as ipr:
        if _index(ipr, bridge) is None:
            raise BridgePortIsolationUnavailable(
                f"bridge port isolation is not available on {bridge}: the bridge does not exist{_where()}"
            )
        try:
            ipr.link("add", ifname=probe, kind="tuntap", mode="tap", ifr={"no_pi": True})
        except (_PyrNetlinkError, OSError, ValueError) as exc:
            log.warning("bridge isolation probe skipped: could not create TAP %s%s: %s", probe, _where(), exc)
            return False
    try:
        enslave(probe, bridge, isolated=True, up=False)
    except NetlinkError as exc:
        raise BridgePortIsolationUnavailable(f"bridge port isolation is not available on {bridge}: {exc}") from exc
    finally:
        delete_link(probe)
    return True
