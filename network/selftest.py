"""Live isolation self-test: does an agent's isolation hold? (the agent page's "self-test"
button), without sending anything that could leave this machine: targets whose route ends here are
probed from the agent's own namespace, every other one is judged from its rules read back from the
kernel. Both kinds of evidence and how to read them: docs/nft-isolation.md ("The isolation self-test")."""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from network.nft.exprs import PRIVATE_DROPS
from network.nft.spec import AgentSpec
from network.nft.verdict import Packet, chain_verdict

if TYPE_CHECKING:
    from network.nft.apply import AgentRules
    from network.probe_guard import ProbeGuard

MAX_TARGETS = 64
DEFAULT_TIMEOUT = 1.0  # seconds per probe
DEFAULT_HOST_SAMPLE_PORTS = (22, 80, 443, 2375, 5432, 6379, 8080)
#: How many host addresses other than the gateway the console's port is probed on.
CONSOLE_PORT_SAMPLE = 2
METADATA = "169.254.169.254"
#: One canary per RFC1918 range, at addresses unlikely to be a host's own (verified, never probed).
DEFAULT_PRIVATE_CANARIES = (("10.255.255.254", 80), ("172.31.255.254", 80), ("192.168.255.254", 80))
#: A public destination (TEST-NET-3: it is never contacted, only judged by the rules).
DEFAULT_PUBLIC_CANARY = ("203.0.113.10", 443)

State = Literal[
    "open",
    "refused",
    "filtered",
    "unreachable",
    "no-reply",
    "error",
    "blocked-by-rule",
    "allowed-by-rule",
    "unverified",
]
#: Human wording of the rule-verified states, for the reachability table.
RULE_STATE_TEXT = {
    "blocked-by-rule": "blocked by rule (verified, not probed)",
    "allowed-by-rule": "allowed by rule (verified, not probed)",
    "unverified": "not verified (not probed)",
}


@dataclass(frozen=True)
class ProbeTarget:
    """One canary: ``proto`` ``tcp``/``udp``, ``host`` (an address literal, never a name),
    ``port``, ``expect_reachable``, a ``label`` saying why it is there, and ``mode``: ``probe``
    (send packets when the route check allows, else verify from the rules) or ``rule`` (never
    send a packet: verify from the rules)."""

    proto: str
    host: str
    port: int
    expect_reachable: bool
    label: str = ""
    mode: str = "probe"

    def __post_init__(self):
        if self.proto not in ("tcp", "udp"):
            raise ValueError(f"probe proto {self.proto!r} must be tcp or udp")
        ipaddress.ip_address(self.host)  # raises ValueError naming the value
        if not 1 <= int(self.port) <= 65535:
            raise ValueError(f"probe port {self.port!r} is outside 1-65535")
        if self.mode not in ("probe", "rule"):
            raise ValueError(f"probe mode {self.mode!r} must be probe or rule")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.proto} {host}:{self.port}"


@dataclass(frozen=True)
class ProbeResult:
    """``state`` as in the module doc; ``passed``: matches the expectation (None when it cannot
    tell); ``elapsed_s`` seconds; ``detail`` the errno text, the deciding rule, or a note.
    ``probed``: whether packets were sent for it."""

    target: ProbeTarget
    state: State
    passed: bool | None
    elapsed_s: float
    detail: str = ""
    probed: bool = True

    @property
    def observed(self) -> str:
        """``state`` in words (``blocked by rule (verified, not probed)`` for rule states)."""
        return RULE_STATE_TEXT.get(self.state, self.state)


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
    except TimeoutError:
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


def verify_by_rules(
    target: ProbeTarget,
    rules: AgentRules | None,
    sets: Mapping[str, Iterable] | None,
    *,
    host_local: bool = False,
    note: str = "",
) -> ProbeResult:
    """Judge ``target`` from the agent's rules read back from the kernel; no packet is sent.

    ``rules``: the agent's :class:`~network.nft.apply.AgentRules` (None: it has none in force).
    ``sets``: the table's address sets (``NftClient.list_address_sets``). ``host_local``: the
    destination is a host address, so the input chain applies, else the forward chain. ``note``:
    why it was not probed (the route check's answer), prefixed to the detail. Blocked means: the
    address is in the chain's verdict map and the chain's first deciding rule drops it.
    """
    start = time.monotonic()
    chain_name = "input" if host_local else "forward"
    prefix = f"{note}; " if note else ""
    state: State
    if rules is None:
        state, detail = "unverified", "no isolation rules are in force for this agent"
    elif not (rules.mapped_input if host_local else rules.mapped_forward):
        state, detail = (
            "unverified",
            f"the agent's address is not in the {chain_name} verdict map: its {chain_name} rules are not in force",
        )
    else:
        pkt = Packet(ipaddress.ip_address(target.host), target.proto, target.port)
        verdict = chain_verdict(rules.input if host_local else rules.forward, pkt, sets or {})
        number = "?" if verdict.index is None else verdict.index + 1
        if verdict.verdict == "unknown":
            state, detail = "unverified", f"{chain_name} rule {number} cannot be read: {verdict.rule}"
        elif verdict.blocks:
            state, detail = "blocked-by-rule", f"{chain_name} rule {number}: {verdict.rule}"
        elif verdict.verdict == "accept":
            state, detail = "allowed-by-rule", f"{chain_name} rule {number}: {verdict.rule}"
        else:
            state, detail = "allowed-by-rule", f"no {chain_name} rule decides it: the hook's accept policy passes it"
    if state == "unverified":
        passed = None if target.expect_reachable else False
    else:
        passed = (state == "allowed-by-rule") == target.expect_reachable
    return ProbeResult(target, state, passed, round(time.monotonic() - start, 4), prefix + detail, probed=False)


def run_isolation_selftest(
    netns_or_container_pid: str | int,
    targets: Iterable[ProbeTarget],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    guard: ProbeGuard,
    rules: AgentRules | None = None,
    sets: Mapping[str, Iterable] | None = None,
) -> list[ProbeResult]:
    """Run every target (at most 64); results in target order. ``netns_or_container_pid``: a namespace
    name or the pid of a process in the sandbox; ``guard``: the route check (required: no packet is
    sent without it); ``rules``/``sets``: read back from the kernel, for targets verified instead of
    probed; ``timeout``: seconds per probe (0 < t ≤ 10). Raises ``ValueError`` for bad arguments,
    ``RuntimeError`` when the namespace cannot be joined (docs/nft-isolation.md, "The isolation self-test").
    """
    targets = list(targets)
    if len(targets) > MAX_TARGETS:
        raise ValueError(f"{len(targets)} probe targets; at most {MAX_TARGETS}")
    if not 0 < timeout <= 10:
        raise ValueError(f"probe timeout {timeout!r} must be in (0, 10] seconds")
    if guard is None:
        raise ValueError("a route guard is required: no probe is sent without one")
    if not targets:
        return []
    results: list[ProbeResult | None] = [None] * len(targets)
    to_probe: list[int] = []
    for i, t in enumerate(targets):
        route = guard.check(t.host)
        if t.mode == "probe" and route.ok:
            to_probe.append(i)
            continue
        note = "never probed" if t.mode == "rule" else route.detail
        results[i] = verify_by_rules(t, rules, sets, host_local=route.where == "local", note=note)
    if to_probe:
        chosen = [targets[i] for i in to_probe]
        socks = _open_sockets(_netns_path(netns_or_container_pid), chosen)
        with ThreadPoolExecutor(max_workers=min(16, len(chosen))) as pool:
            probed = list(pool.map(lambda pair: _probe(pair[0], pair[1], timeout), zip(socks, chosen, strict=True)))
        for i, r in zip(to_probe, probed, strict=True):
            results[i] = r
    return [r for r in results if r is not None]


def default_selftest_targets(
    spec: AgentSpec,
    *,
    other_agents: Iterable[str] = (),
    private_canaries: Iterable[tuple[str, int]] = DEFAULT_PRIVATE_CANARIES,
    host_sample_ports: Iterable[int] = DEFAULT_HOST_SAMPLE_PORTS,
    metadata: tuple[str, int] | None = (METADATA, 80),
    public: tuple[str, int] | None = DEFAULT_PUBLIC_CANARY,
    agent_port: int = 22,
    console_port: int | None = None,
    host_addresses: Iterable[str] = (),
) -> list[ProbeTarget]:
    """The canaries for one agent, from its resolved rules: probed (``mode="probe"``, still subject to
    the route check) its host-access entries, other gateway ports, ``other_agents`` on
    ``agent_port`` and ``console_port`` on other ``host_addresses``; verified from the rules
    (``mode="rule"``) ``private_canaries``, ``metadata`` and ``public``. Which is expected blocked, and
    why: docs/nft-isolation.md ("The isolation self-test"). Capped at 64 targets.
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
            host = (
                str(net.network_address)
                if net.prefixlen == net.max_prefixlen
                else str(next(net.hosts(), net.network_address))
            )
        if host is not None:
            allowed.append(ProbeTarget("tcp", host, entry.port, True, f"hostAccess {entry.canonical}"))

    def allowed_on_host(port: int) -> bool:
        for e in spec.host_access:
            addr_ok = spec.gateway.version == 4 if e.daddr is None else spec.gateway in e.daddr
            if addr_ok and (e.port is None or e.port == port):
                return True
        return False

    def allowlisted(host: str) -> bool:
        return any(ipaddress.ip_address(host) in n for n in spec.allowlist)

    blocked = [
        ProbeTarget("tcp", gw, p, False, "host port not in hostAccess")
        for p in host_sample_ports
        if not allowed_on_host(p)
    ]
    if console_port is not None:
        elsewhere = [
            a
            for a in (ipaddress.ip_address(h) for h in host_addresses)
            if a.version == spec.gateway.version and a != spec.gateway and not (a.is_loopback or a.is_link_local)
        ]
        for address in elsewhere[:CONSOLE_PORT_SAMPLE]:
            opened = any(
                (e.port is None or e.port == console_port)
                and (address.version == 4 if e.daddr is None else address in e.daddr)
                for e in spec.host_access
            )
            why = "the console's port on a host address other than the agents' gateway"
            blocked.append(ProbeTarget("tcp", str(address), console_port, opened, why))
    blocked += [ProbeTarget("tcp", a, agent_port, False, "another agent") for a in other_agents]
    for host, port in private_canaries:
        if allowlisted(host):
            continue
        label = "metadata / link-local" if ipaddress.ip_address(host) in PRIVATE_DROPS[3] else "RFC1918"
        blocked.append(ProbeTarget("tcp", host, port, False, label, mode="rule"))
    if metadata is not None and not allowlisted(metadata[0]):
        blocked.append(ProbeTarget("tcp", metadata[0], metadata[1], False, "cloud metadata service", mode="rule"))
    if public is not None:
        reachable = allowlisted(public[0]) or not spec.deny_all
        why = "a public address" + (" (denyAll)" if spec.deny_all else "")
        blocked.append(ProbeTarget("tcp", public[0], public[1], reachable, why, mode="rule"))
    return (allowed + blocked)[:MAX_TARGETS]
