"""Live isolation self-test: canary connections from inside an agent's network namespace
(issue 5 item 7, the agent page's "self-test" button).

Sockets are created on a thread that joined the agent's namespace with ``setns`` (from a named
namespace or from ``/proc/<pid>/ns/net`` of any process inside the sandbox, e.g. a container's
init), so the probes leave from the agent's own interface with the agent's own address and hit the
same rules its traffic does. Every probe has a timeout; probes run in parallel; the number of
targets is capped. Needs CAP_SYS_ADMIN (setns) — the console's network worker runs as root.

Reading a result: ``open`` (handshake completed) and ``refused`` (the host answered with a reset
or an ICMP port-unreachable) both mean packets got through the firewall; ``filtered`` (silence
until the timeout) and ``unreachable`` (no route / ICMP unreachable) mean they did not. A target
expected blocked that answers ``refused`` is a FAIL: the port is merely closed, not isolated.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from network.nft.render import PRIVATE_DROPS, AgentSpec

MAX_TARGETS = 64
DEFAULT_TIMEOUT = 1.0  # seconds per probe
DEFAULT_HOST_SAMPLE_PORTS = (22, 80, 443, 2375, 5432, 6379, 8080)
METADATA = "169.254.169.254"

State = Literal["open", "refused", "filtered", "unreachable", "no-reply", "error"]


@dataclass(frozen=True)
class ProbeTarget:
    """One canary: ``proto`` ``tcp``/``udp``, ``host`` (an address literal, never a name),
    ``port``, ``expect_reachable``, and a ``label`` saying why it is probed."""

    proto: str
    host: str
    port: int
    expect_reachable: bool
    label: str = ""

    def __post_init__(self):
        if self.proto not in ("tcp", "udp"):
            raise ValueError(f"probe proto {self.proto!r} must be tcp or udp")
        ipaddress.ip_address(self.host)  # raises ValueError naming the value
        if not 1 <= int(self.port) <= 65535:
            raise ValueError(f"probe port {self.port!r} is outside 1-65535")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.proto} {host}:{self.port}"


@dataclass(frozen=True)
class ProbeResult:
    """``state`` as in the module doc; ``passed``: matches the expectation (None when a UDP probe
    cannot tell); ``elapsed_s`` seconds; ``detail`` the errno text or note."""

    target: ProbeTarget
    state: State
    passed: bool | None
    elapsed_s: float
    detail: str = ""


def _netns_path(netns_or_pid: str | int) -> str:
    if isinstance(netns_or_pid, int) or (isinstance(netns_or_pid, str) and netns_or_pid.isdigit()):
        pid = int(netns_or_pid)
        if pid <= 0:
            raise ValueError(f"pid {pid} is not a process id")
        return f"/proc/{pid}/ns/net"
    if not isinstance(netns_or_pid, str) or not netns_or_pid or "/" in netns_or_pid:
        raise ValueError(f"network namespace {netns_or_pid!r} must be a name under /run/netns or a pid")
    return f"/run/netns/{netns_or_pid}"


def _open_sockets(path: str, targets: Sequence[ProbeTarget]) -> list[socket.socket]:
    """Create one socket per target inside the namespace at ``path`` (on a setns'd thread)."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            box["error"] = RuntimeError(f"cannot open network namespace {path}: {exc.strerror}")
            return
        socks: list[socket.socket] = []
        try:
            os.setns(fd, os.CLONE_NEWNET)
            for t in targets:
                family = socket.AF_INET6 if ipaddress.ip_address(t.host).version == 6 else socket.AF_INET
                socks.append(socket.socket(family, socket.SOCK_STREAM if t.proto == "tcp" else socket.SOCK_DGRAM))
            box["value"] = socks
        except OSError as exc:
            for s in socks:
                s.close()
            box["error"] = RuntimeError(f"cannot join network namespace {path}: {exc.strerror}")
        finally:
            os.close(fd)

    thread = threading.Thread(target=work, name="selftest-setns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM, errno.EADDRNOTAVAIL}


def _probe(sock: socket.socket, target: ProbeTarget, timeout: float) -> ProbeResult:
    start = time.monotonic()
    state: State
    detail = ""
    try:
        sock.settimeout(timeout)
        if target.proto == "tcp":
            sock.connect((target.host, target.port))
            state = "open"
        else:
            sock.connect((target.host, target.port))
            sock.send(b"kici-selftest-" + secrets.token_hex(4).encode())
            sock.recv(512)
            state = "open"
    except (TimeoutError, socket.timeout):
        state = "filtered" if target.proto == "tcp" else "no-reply"
    except ConnectionRefusedError:
        state = "refused"
    except OSError as exc:
        state = "unreachable" if exc.errno in _UNREACHABLE else "error"
        detail = exc.strerror or str(exc)
    finally:
        sock.close()
    elapsed = time.monotonic() - start
    if state == "error":
        passed: bool | None = None
    elif state == "no-reply":
        # Silence is what a drop looks like, and also what a service that never answers looks like.
        passed = None if target.expect_reachable else True
        detail = detail or "no reply (UDP cannot tell a drop from a silent service)"
    else:
        reached = state in ("open", "refused")
        passed = reached == target.expect_reachable
        if state == "refused" and not target.expect_reachable:
            detail = "the host answered: the port is closed, not isolated"
    return ProbeResult(target, state, passed, round(elapsed, 4), detail)


def run_isolation_selftest(
    netns_or_container_pid: str | int, targets: Iterable[ProbeTarget], timeout: float = DEFAULT_TIMEOUT
) -> list[ProbeResult]:
    """Probe every target from inside the agent's network namespace; results in target order.

    ``netns_or_container_pid``: a namespace name (``/run/netns/<name>``) or the pid of any process
    in the sandbox (``/proc/<pid>/ns/net``; a container's ``State.Pid``). ``timeout``: seconds per
    probe (0 < t ≤ 10). At most 64 targets. Raises ``ValueError`` for bad arguments and
    ``RuntimeError`` when the namespace cannot be joined.
    """
    targets = list(targets)
    if len(targets) > MAX_TARGETS:
        raise ValueError(f"{len(targets)} probe targets; at most {MAX_TARGETS}")
    if not 0 < timeout <= 10:
        raise ValueError(f"probe timeout {timeout!r} must be in (0, 10] seconds")
    if not targets:
        return []
    socks = _open_sockets(_netns_path(netns_or_container_pid), targets)
    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        return list(pool.map(lambda pair: _probe(pair[0], pair[1], timeout), zip(socks, targets, strict=True)))


def default_selftest_targets(
    spec: AgentSpec,
    *,
    other_agents: Iterable[str] = (),
    private_canaries: Iterable[tuple[str, int]] = (),
    host_sample_ports: Iterable[int] = DEFAULT_HOST_SAMPLE_PORTS,
    metadata: tuple[str, int] | None = (METADATA, 80),
    agent_port: int = 22,
) -> list[ProbeTarget]:
    """The canaries for one agent, from its resolved rules (issue 5 item 7).

    Expected reachable: each host-access entry with a port, on its address (the gateway for a
    wildcard entry; the network's first address for a CIDR), over TCP. Expected blocked: a sample
    of other gateway ports not allowed by any entry, ``other_agents`` (their ``agent_port``),
    ``private_canaries`` (address, port) in RFC1918 unless allowlisted, and the metadata service.
    Capped at 64 targets.
    """
    gw = str(spec.gateway)
    allowed: list[ProbeTarget] = []
    for entry in spec.host_access:
        if entry.port is None:
            continue
        if entry.daddr is None:
            host = gw if spec.gateway.version == 4 else None
        else:
            net = entry.daddr
            host = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(next(net.hosts(), net.network_address))
        if host is not None:
            allowed.append(ProbeTarget("tcp", host, entry.port, True, f"hostAccess {entry.canonical}"))

    def allowed_on_host(port: int) -> bool:
        for e in spec.host_access:
            addr_ok = spec.gateway.version == 4 if e.daddr is None else spec.gateway in e.daddr
            if addr_ok and (e.port is None or e.port == port):
                return True
        return False

    blocked = [
        ProbeTarget("tcp", gw, p, False, "host port not in hostAccess")
        for p in host_sample_ports
        if not allowed_on_host(p)
    ]
    blocked += [ProbeTarget("tcp", a, agent_port, False, "another agent") for a in other_agents]
    for host, port in private_canaries:
        addr = ipaddress.ip_address(host)
        if any(addr in n for n in spec.allowlist):
            continue
        label = "metadata / link-local" if addr in PRIVATE_DROPS[3] else "RFC1918"
        blocked.append(ProbeTarget("tcp", host, port, False, label))
    if metadata is not None and not any(ipaddress.ip_address(metadata[0]) in n for n in spec.allowlist):
        blocked.append(ProbeTarget("tcp", metadata[0], metadata[1], False, "cloud metadata service"))
    return (allowed + blocked)[:MAX_TARGETS]
