"""A throwaway network lab for isolation tests: namespaces, a bridge, veths, listeners, probes.

Topology built by :class:`Lab` (all addresses live only inside namespaces the lab creates; the
host namespace of the lab has no uplink, so no packet can leave the machine)::

    agent ns "a1" (eth0 10.213.0.5, fd13::5) ──veth── ┐
    agent ns "a2" (eth0 10.213.0.6, fd13::6) ──veth── ┤ br0 (isolated ports)   "host" ns
                                                      └ 10.213.0.1/24, fd13::1/64
                                                        lo: 10.99.0.1, 169.254.1.1  (host's own)
                                                        lan0 10.214.0.1/24  ──veth── "lan" ns
                                                             198.51.100.1/24   lan1 10.214.0.2/24
                                                                                    198.51.100.2/24
                                                                           lo: 203.0.113.7, 100.64.0.7,
                                                                               169.254.169.254

198.51.100.0/24 stands for a non-RFC1918 subnet the host is connected to (its uplink's LAN);
203.0.113.7 for a public address routed through it; 100.64.0.7 for shared address space.

Packets from an agent to the host's own addresses cross the *input* hook of the host ns; packets to
the lan ns cross its *forward* hook. Sockets are opened inside a namespace by a short-lived thread
that ``setns()``-es into it (a socket stays in the namespace it was created in), so probes run in
this process with bounded timeouts. Everything is deleted by :meth:`Lab.close`.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from network import netlink

NS_PREFIX = "net-"  # every namespace this harness creates starts with it (found again by prefix)
HELLO = b"hello\n"


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a command, raising with its stderr on failure when ``check``."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def in_netns(name: str, fn: Callable[[], object]) -> object:
    """Call ``fn`` on a fresh thread that has joined network namespace ``name`` (a name under
    /run/netns, or a path such as ``/proc/<pid>/ns/net``); return its result."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            fd = os.open(name if name.startswith("/") else f"/run/netns/{name}", os.O_RDONLY)
            try:
                os.setns(fd, os.CLONE_NEWNET)
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"setns-{name}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def _family(host: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET


class Netns:
    """One named network namespace (``ip netns add``), deleted by :meth:`delete`."""

    def __init__(self, name: str):
        self.name = name
        run(["ip", "netns", "add", name])
        self.ip("link", "set", "lo", "up")

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["ip", "-n", self.name, *args], check=check)

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.name, *argv], check=check)

    def sysctl(self, key: str, value: str) -> None:
        self.exec("sysctl", "-qw", f"{key}={value}")

    def socket(self, family: int, kind: int) -> socket.socket:
        """A socket created inside this namespace."""
        return in_netns(self.name, lambda: socket.socket(family, kind))  # type: ignore[return-value]

    def delete(self) -> None:
        run(["ip", "netns", "del", self.name], check=False)


class ProcessNetns:
    """The network namespace of a running process (a container's init): probes from inside it."""

    def __init__(self, pid: int):
        self.name = f"/proc/{pid}/ns/net"

    def socket(self, family: int, kind: int) -> socket.socket:
        return in_netns(self.name, lambda: socket.socket(family, kind))  # type: ignore[return-value]


class Listener:
    """A TCP server answering ``hello`` to each connection, or a UDP echo server, in a namespace."""

    def __init__(self, ns: Netns, port: int, proto: str = "tcp", bind: str = "0.0.0.0"):
        family = _family(bind)
        self.sock = ns.socket(family, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind((bind, port))
        if proto == "tcp":
            self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.proto = proto
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"listen-{ns.name}-{proto}{port}")
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                if self.proto == "tcp":
                    conn, _ = self.sock.accept()
                    with conn:
                        conn.sendall(HELLO)
                else:
                    data, peer = self.sock.recvfrom(2048)
                    self.sock.sendto(data, peer)
            except TimeoutError:
                continue
            except OSError:
                if self.stopped.is_set():
                    return

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)
        self.sock.close()


class CountingListener:
    """A TCP listener in a namespace that counts the connections it accepts (says hello and closes
    each), or a UDP one that counts the datagrams it receives. ``ns``: a :class:`Netns` or a
    :class:`ProcessNetns` (``ProcessNetns(os.getpid())`` for this process's own)."""

    def __init__(self, ns: Netns | ProcessNetns, port: int, proto: str = "tcp", bind: str = "0.0.0.0"):
        self.udp = proto == "udp"
        self.sock = ns.socket(socket.AF_INET, socket.SOCK_DGRAM if self.udp else socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, port))
        if not self.udp:
            self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.count = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                if self.udp:
                    self.sock.recvfrom(2048)
                else:
                    conn, _ = self.sock.accept()
                    with conn:
                        conn.sendall(HELLO)
            except TimeoutError:
                continue
            except OSError:
                if self.stopped.is_set():
                    return
                continue
            self.count += 1

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)
        self.sock.close()


class EchoListener:
    """A TCP server in a namespace that keeps each connection open and echoes what it receives
    (for tests that follow one long-lived connection across a rule change)."""

    def __init__(self, ns: Netns, port: int, bind: str = "0.0.0.0"):
        self.sock = ns.socket(_family(bind), socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, port))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.stopped = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"echo-{ns.name}-{port}")
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                data = conn.recv(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            try:
                conn.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)
        for conn in self.conns:
            conn.close()
        self.sock.close()


@dataclass(frozen=True)
class Target:
    """A probe target: ``proto`` (tcp/udp), ``host`` (address literal), ``port``."""

    proto: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.proto}:{host}:{self.port}"


def _sockaddr(ns: Netns, host: str, port: int) -> tuple:
    """``(host, port)``, or for a scoped IPv6 literal (``fe80::1%eth0``) the 4-tuple with the
    interface index looked up inside ``ns`` (the calling thread's namespace has other indexes)."""
    if "%" not in host:
        return (host, port)
    addr, ifname = host.split("%", 1)
    index = in_netns(ns.name, lambda: socket.if_nametoindex(ifname))
    return (addr, port, 0, index)


def tcp_reachable(ns: Netns, host: str, port: int, timeout: float = 0.4) -> bool:
    """True when a TCP connection from ``ns`` to host:port completes and the server says hello."""
    sock = ns.socket(_family(host), socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(_sockaddr(ns, host, port))
        return sock.recv(16) == HELLO
    except OSError:
        return False
    finally:
        sock.close()


def udp_reachable(ns: Netns, host: str, port: int, timeout: float = 0.4) -> bool:
    """True when a UDP datagram from ``ns`` to host:port is echoed back."""
    sock = ns.socket(_family(host), socket.SOCK_DGRAM)
    sock.settimeout(timeout)
    payload = secrets.token_bytes(8)
    try:
        sock.sendto(payload, _sockaddr(ns, host, port))
        data, _ = sock.recvfrom(64)
        return data == payload
    except OSError:
        return False
    finally:
        sock.close()


def reachable(ns: Netns, target: Target, timeout: float = 0.4) -> bool:
    probe = tcp_reachable if target.proto == "tcp" else udp_reachable
    return probe(ns, target.host, target.port, timeout)


def reachability(ns: Netns, targets: Iterable[Target], timeout: float = 0.4) -> dict[str, bool]:
    """Probe every target from ``ns`` in parallel; ``{"tcp:10.213.0.1:53": True, ...}``."""
    targets = list(targets)
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(targets)))) as pool:
        results = list(pool.map(lambda t: reachable(ns, t, timeout), targets))
    return {str(t): ok for t, ok in zip(targets, results, strict=True)}


def both(host: str, *ports: int) -> list[Target]:
    """TCP and UDP targets for each port on ``host``."""
    return [Target(proto, host, port) for port in ports for proto in ("tcp", "udp")]


@dataclass
class Agent:
    name: str
    ns: Netns
    port: str  # the host-side veth, a port of the bridge
    ipv4: str | None
    ipv6: str | None
    mac: str = ""  # of eth0, the agent's side


@dataclass
class Lab:
    """The topology in the module doc. Build with :meth:`create`; always :meth:`close`."""

    tag: str
    host: Netns
    lan: Netns
    bridge: str = "br0"
    gateway: str = "10.213.0.1"
    gateway6: str = "fd13::1"
    host_ports: tuple[int, ...] = (53, 4000, 4001, 9000)
    agent_port: int = 7000
    agents: dict[str, Agent] = field(default_factory=dict)
    listeners: list[Listener] = field(default_factory=list)

    @classmethod
    def create(cls) -> Lab:
        tag = secrets.token_hex(3)
        made: list[Netns] = []
        try:
            host = Netns(f"{NS_PREFIX}{tag}-host")
            made.append(host)
            lan = Netns(f"{NS_PREFIX}{tag}-lan")
            made.append(lan)
            lab = cls(tag=tag, host=host, lan=lan)
            lab._build()
            return lab
        except BaseException:
            for ns in made:
                ns.delete()
            raise

    def _build(self) -> None:
        h, lan = self.host, self.lan
        netlink.ensure_bridge(self.bridge, f"{self.gateway}/24", netns=h.name)
        h.ip("addr", "add", f"{self.gateway6}/64", "dev", self.bridge, "nodad")
        # This kernel has no dummy driver; addresses on lo are just as local (input hook).
        h.ip("addr", "add", "10.99.0.1/32", "dev", "lo")
        h.ip("addr", "add", "169.254.1.1/32", "dev", "lo")
        h.ip("link", "add", "lan0", "type", "veth", "peer", "name", "lan1", "netns", lan.name)
        h.ip("addr", "add", "10.214.0.1/24", "dev", "lan0")
        h.ip("link", "set", "lan0", "up")
        h.ip("addr", "add", "198.51.100.1/24", "dev", "lan0")
        h.ip("route", "add", "203.0.113.0/24", "via", "10.214.0.2")
        h.ip("route", "add", "100.64.0.0/24", "via", "10.214.0.2")
        h.ip("route", "add", "169.254.169.254/32", "via", "10.214.0.2")
        h.sysctl("net.ipv4.ip_forward", "1")
        h.sysctl("net.ipv6.conf.all.forwarding", "1")
        lan.ip("addr", "add", "10.214.0.2/24", "dev", "lan1")
        lan.ip("link", "set", "lan1", "up")
        lan.ip("addr", "add", "198.51.100.2/24", "dev", "lan1")
        lan.ip("addr", "add", "203.0.113.7/32", "dev", "lo")
        lan.ip("addr", "add", "100.64.0.7/32", "dev", "lo")
        lan.ip("addr", "add", "169.254.169.254/32", "dev", "lo")
        lan.ip("route", "add", "default", "via", "10.214.0.1")
        for port in self.host_ports:
            for proto in ("tcp", "udp"):
                self.listeners.append(Listener(h, port, proto, "0.0.0.0"))
                self.listeners.append(Listener(h, port, proto, "::"))
        for proto in ("tcp", "udp"):
            self.listeners.append(Listener(lan, 80, proto, "0.0.0.0"))

    def add_agent(self, name: str, ipv4: str | None, ipv6: str | None = None, isolated: bool = True) -> Agent:
        """An agent namespace behind the bridge: veth ``<name>`` (host side, enslaved with port
        isolation ``isolated``) ↔ ``eth0`` in the agent, default routes via the gateway, and TCP/UDP
        listeners on :attr:`agent_port`."""
        ns = Netns(f"{NS_PREFIX}{self.tag}-{name}")
        agent = Agent(name=name, ns=ns, port=name, ipv4=ipv4, ipv6=ipv6)
        self.agents[name] = agent
        self.host.ip("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        netlink.enslave(name, self.bridge, isolated=isolated, netns=self.host.name)
        if ipv4:
            ns.ip("addr", "add", f"{ipv4}/24", "dev", "eth0")
        if ipv6:
            ns.ip("addr", "add", f"{ipv6}/64", "dev", "eth0", "nodad")
        ns.ip("link", "set", "eth0", "up")
        agent.mac = ns.exec("cat", "/sys/class/net/eth0/address").stdout.strip()
        if ipv4:
            ns.ip("route", "add", "default", "via", self.gateway)
            self.listeners += [Listener(ns, self.agent_port, p, "0.0.0.0") for p in ("tcp", "udp")]
        if ipv6:
            ns.ip("-6", "route", "add", "default", "via", self.gateway6)
            self.listeners += [Listener(ns, self.agent_port, p, "::") for p in ("tcp", "udp")]
        return agent

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()
        for agent in self.agents.values():
            agent.ns.delete()
        self.lan.delete()
        self.host.delete()


def leftover_namespaces() -> list[str]:
    """Namespaces this harness created that still exist (for a cleanup assertion)."""
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NS_PREFIX)]
