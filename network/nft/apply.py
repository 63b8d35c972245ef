"""The one place that sends isolation rules to the kernel, for container and firecracker agents.

Every change is ONE JSON transaction, run in this process by libnftables (the library behind
``nft -j -f -``), so all of an agent's rules appear or none do. Reads are JSON listings
(``list table ...``) interpreted by chain and map names (``network.nft.render``), never by
matching rule text.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from network.netlink import NetlinkError
from network.nft.describe import describe_expr
from network.nft.exprs import base_rule_exprs, bridge_rule_exprs, guard_rule_exprs
from network.nft.libnft import DEFAULT_LIBRARY, LibraryUnavailableError, NftContext
from network.nft.names import BRIDGE_FAMILY, FAMILY, MAPS, PORT_SETS, guard_chain_name, parse_chain_name
from network.nft.render import (
    document,
    render_agent_add,
    render_agent_remove,
    render_egress_baseline,
    render_full,
    render_table_base,
)
from network.nft.spec import AgentSpec, IPAddress, validate_table_name

log = logging.getLogger(__name__)


class NftError(RuntimeError):
    """An nft command failed. ``command`` (its first line, cut to 200 characters), ``returncode``
    (libnftables' result) and ``stderr`` (its error text) say how."""

    def __init__(self, message: str, *, command: str = "", returncode: int | None = None, stderr: str = ""):
        super().__init__(message)
        self.command = command
        self.returncode = returncode
        self.stderr = stderr

    @property
    def missing_object(self) -> bool:
        """True when nft reported that a table, chain, map or element does not exist."""
        return "No such file or directory" in self.stderr


class NftUnavailableError(NftError):
    """nftables cannot be used here: libnftables is missing or the process lacks CAP_NET_ADMIN."""


@dataclass
class AgentRules:
    """One agent's rules as read back from the kernel.

    ``forward`` / ``input``: the rules of its chains, each a list of nft JSON expressions, in
    order (empty when the chain is missing). ``has_forward_chain`` / ``has_input_chain``: whether
    the chains exist. ``mapped_forward`` / ``mapped_input``: whether the address is in the
    forward / input verdict map (pointing at its own chain). ``ports``: the bridge ports bound to
    the address in the bridge table's port set (what the guard lets through).
    """

    address: IPAddress
    forward: list[list[dict]] = field(default_factory=list)
    input: list[list[dict]] = field(default_factory=list)
    has_forward_chain: bool = False
    has_input_chain: bool = False
    mapped_forward: bool = False
    mapped_input: bool = False
    ports: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Both chains exist and both map elements point at them."""
        return self.has_forward_chain and self.has_input_chain and self.mapped_forward and self.mapped_input

    def describe(self) -> list[str]:
        """Human-readable lines, ``forward: ip daddr 172.30.0.1 accept`` etc., in chain order."""
        lines = [f"forward: {describe_expr(e)}" for e in self.forward]
        lines += [f"input: {describe_expr(e)}" for e in self.input]
        lines += [f"guard: frames from port {p} with source {self.address} pass" for p in self.ports]
        if not (self.mapped_forward and self.mapped_input):
            missing = [k for k, ok in (("forward", self.mapped_forward), ("input", self.mapped_input)) if not ok]
            lines.append(f"warning: not in the {' and '.join(missing)} map; these rules are not in force")
        return lines


class NftClient:
    """Applies and reads one console's isolation table (``inet <table>``).

    Commands run in this process through libnftables (:mod:`network.nft.libnft`), one context per
    client. ``table``: the configured table name (never a hard-coded one). ``library``: the
    libnftables shared object. ``netns``: act inside that named network namespace
    (``/run/netns/<netns>``), as the tests and the bench do. Raises :class:`RuleSpecError` for a
    bad table name.
    """

    def __init__(self, table: str, library: str = DEFAULT_LIBRARY, netns: str | None = None):
        self.table = validate_table_name(table)
        self.library = library
        self.netns = netns
        self._context: NftContext | None = None
        self._context_lock = threading.Lock()
        self._base_ready = False

    # -- plumbing ------------------------------------------------------------------------------

    def _run(self, command: str) -> str:
        """Run one command buffer (nft syntax, or a JSON document: one transaction); returns the
        JSON output. Raises NftUnavailableError when libnftables cannot be loaded, NftError when
        the command fails or the namespace cannot be joined."""
        head = command.splitlines()[0][:200] if command else ""
        try:
            with self._context_lock:
                if self._context is None:
                    self._context = NftContext(self.library, self.netns)
            rc, out, err = self._context.run(command)
        except LibraryUnavailableError as exc:
            raise NftUnavailableError(
                f"nftables is not available: {exc}. Install the libnftables1 package, or turn network "
                "isolation off for this scaler.",
                command=head,
            ) from None
        except NetlinkError as exc:
            raise NftError(f"nft {head[:80]!r} failed: {exc}", command=head, stderr=str(exc)) from None
        if rc != 0:
            stderr = err.strip()
            raise NftError(
                f"nft {head[:80]!r}{' ...' if len(command) > 80 else ''} failed (rc {rc}): {stderr[:2000]}",
                command=head,
                returncode=rc,
                stderr=stderr,
            )
        return out

    def apply_document(self, commands: list[dict]) -> None:
        """Send commands as ONE JSON transaction (all apply or none). Raises NftError."""
        if not commands:
            return
        self._run(json.dumps(document(commands), separators=(",", ":")))

    # -- checks --------------------------------------------------------------------------------

    def check_available(self) -> None:
        """Fail closed when nft cannot be used.

        Runs ``list tables``. Raises :class:`NftUnavailableError` saying libnftables is
        missing or that the process lacks CAP_NET_ADMIN, or :class:`NftError` for anything else.
        """
        try:
            self._run("list tables")
        except NftUnavailableError:
            raise
        except NftError as exc:
            text = exc.stderr or str(exc)
            if "Operation not permitted" in text or "Permission denied" in text:
                raise NftUnavailableError(
                    "nftables is installed but this process may not change rules (missing CAP_NET_ADMIN). "
                    "Run the worker as root, grant it CAP_NET_ADMIN, or turn network "
                    f"isolation off for this scaler. nft said: {text}",
                    command=exc.command,
                    returncode=exc.returncode,
                    stderr=exc.stderr,
                ) from None
            if "not found" in text.lower() or "No such file" in text:
                raise NftUnavailableError(
                    f"nftables is not available: {text}",
                    command=exc.command,
                    returncode=exc.returncode,
                    stderr=exc.stderr,
                ) from None
            raise NftError(
                f"nftables check failed: {text}", command=exc.command, returncode=exc.returncode, stderr=exc.stderr
            ) from None

    # -- writes --------------------------------------------------------------------------------

    def ensure_table(self, guard_interfaces: Iterable[str] = (), guard_networks: Iterable[str] = ()) -> None:
        """Create (or refresh) both tables, their maps and sets, the base chains and a guard chain
        per bridge; agent rules are kept.

        ``guard_interfaces``: bridges whose frames pass only from a known agent on its own port
        (each must exist); ``guard_networks``: their IPv4 subnets (never bridged port to port).
        Safe to call any number of times. Raises RuleSpecError / NftError.
        """
        self.apply_document(render_table_base(self.table, guard_interfaces, guard_networks))
        self._base_ready = True

    def ensure_egress(self, subnet: str, egress_interface: str, mss: int = 1460) -> None:
        """Masquerade and MSS clamp for a VM subnet leaving through ``egress_interface``
        (``render_egress_baseline``); idempotent. Raises RuleSpecError / NftError."""
        self.apply_document(render_egress_baseline(self.table, subnet, egress_interface, mss))

    def apply_agent(self, spec: AgentSpec) -> None:
        """Write (or replace) one agent's rules in one transaction; creates the base on first use.

        Replacing flushes and refills the agent's chains in the same transaction as the new rules,
        so there is no moment without rules and no duplicate after a repeat. Raises NftError.
        """
        if not self._base_ready:
            self.ensure_table()
        try:
            self.apply_document(render_agent_add(self.table, spec))
        except NftError as exc:
            if not exc.missing_object:
                raise
            # The table vanished under us (deleted by hand, a host reboot of nft state): rebuild once.
            self.ensure_table()
            self.apply_document(render_agent_add(self.table, spec))

    def remove_agent(self, address: IPAddress | str) -> bool:
        """Unbind every port bound to one agent's address, delete its map elements and chains, in
        one transaction (so its frames stop passing the guard the moment its rules go).

        Missing table, chain or element is a no-op. Returns True when something was removed.
        Raises NftError for other failures.
        """
        addr = ipaddress.ip_address(address) if isinstance(address, str) else address
        ports = self.bound_ports_of(addr)
        try:
            self.apply_document(render_agent_remove(self.table, addr, ports=ports))
            return True
        except NftError as exc:
            if not exc.missing_object:
                raise
        # Something is missing, and one missing object fails the whole transaction: read what
        # exists and delete only that.
        agents = self.list_agents()
        if agents is None or addr not in agents:
            return False
        current = agents[addr]
        cmds = render_agent_remove(
            self.table,
            addr,
            mapped=[k for k, ok in (("fwd", current.mapped_forward), ("in", current.mapped_input)) if ok],
            chains=[k for k, ok in (("fwd", current.has_forward_chain), ("in", current.has_input_chain)) if ok],
            ports=current.ports,
        )
        self.apply_document(cmds)
        return bool(cmds)

    def self_heal(
        self, specs: Iterable[AgentSpec], guard_interfaces: Iterable[str] = (), guard_networks: Iterable[str] = ()
    ) -> None:
        """Re-apply the base and every given agent in ONE transaction. Idempotent: twice in a row
        leaves exactly one copy of each rule. Agents not in ``specs`` are left alone (reaping is a
        separate decision).
        """
        self.apply_document(render_full(self.table, list(specs), guard_interfaces, guard_networks))
        self._base_ready = True

    def delete_table(self) -> bool:
        """Delete both tables (tests, bench, decommissioning). Both missing → False."""
        deleted = False
        for family in (FAMILY, BRIDGE_FAMILY):
            try:
                self.apply_document([{"delete": {"table": {"family": family, "name": self.table}}}])
                deleted = True
            except NftError as exc:
                if not exc.missing_object:
                    raise
        self._base_ready = False
        return deleted

    # -- reads ---------------------------------------------------------------------------------

    def list_table(self, family: str = FAMILY) -> list[dict] | None:
        """The ``nftables`` array of the JSON ``list table <family> <table>``; None if it is absent."""
        try:
            out = self._run(f"list table {family} {self.table}")
        except NftError as exc:
            if exc.missing_object:
                return None
            raise
        return json.loads(out).get("nftables", [])

    def bound_ports_of(self, address: IPAddress) -> list[str]:
        """The ports bound to ``address`` (one ``list set`` of its family's port set); [] when the
        bridge table or set is absent."""
        try:
            out = self._run(f"list set {BRIDGE_FAMILY} {self.table} {PORT_SETS[address.version]}")
        except NftError as exc:
            if exc.missing_object:
                return []
            raise
        return sorted(_port_pairs(json.loads(out).get("nftables", [])).get(address, []))

    def list_bound_ports(self) -> dict[IPAddress, list[str]]:
        """Address → the ports bound to it in the bridge table's port sets; ``{}`` when absent."""
        return _port_pairs(self.list_table(BRIDGE_FAMILY) or [])

    def list_address_sets(self) -> dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
        """The table's address sets (``private4`` …) read back from the kernel: set name → its
        elements as networks (single addresses as /32 or /128, ranges summarised). Sets of other
        types are left out. ``{}`` when the table is absent; raises NftError."""
        out: dict[str, list] = {}
        for item in self.list_table() or []:
            body = item.get("set")
            if not body or body.get("type") not in ("ipv4_addr", "ipv6_addr"):
                continue
            nets: list = []
            for elem in body.get("elem", []):
                if isinstance(elem, dict) and "elem" in elem:
                    elem = elem["elem"].get("val")
                if isinstance(elem, dict) and "prefix" in elem:
                    nets.append(ipaddress.ip_network(f"{elem['prefix']['addr']}/{elem['prefix']['len']}"))
                elif isinstance(elem, dict) and "range" in elem:
                    lo, hi = (ipaddress.ip_address(v) for v in elem["range"])
                    nets.extend(ipaddress.summarize_address_range(lo, hi))
                elif isinstance(elem, str):
                    nets.append(ipaddress.ip_network(elem))
            out[body["name"]] = nets
        return out

    def list_agents(self) -> dict[IPAddress, AgentRules]:
        """Every agent with a chain, map element or port binding in the tables, read back from the kernel.

        Ownership comes from names only: chains ``a4-…-fwd``/``-in``, map elements of
        ``agents{4,6}_{fwd,in}``, elements of the bridge table's port sets. Returns ``{}`` when the
        table is absent. Raises NftError when the listing fails (callers that must not act blind
        catch it).
        """
        return self.snapshot()[0]

    def snapshot(self, guard_interfaces: Iterable[str] = ()) -> tuple[dict[IPAddress, AgentRules], list[str]]:
        """``(agents, base_problems)`` from one listing of each table: every agent as
        :meth:`list_agents` reads it, and what is missing or changed in the base: each problem a
        line (``inet chain forward: 0 rules, expected 2``, ``inet chain guard-kici-br0 is missing``); [] when
        the base is as rendered. Raises NftError."""
        items = self.list_table()
        bridge_items = self.list_table(BRIDGE_FAMILY)
        if items is None:
            return {}, [f"table {FAMILY} {self.table} is missing"]
        agents = _agents_from(items, _port_pairs(bridge_items or []))
        expected = {(FAMILY, c): len(r) for c, r in base_rule_exprs().items()}
        expected |= {(FAMILY, guard_chain_name(i)): len(guard_rule_exprs()) for i in guard_interfaces}
        expected |= {(BRIDGE_FAMILY, c): len(r) for c, r in bridge_rule_exprs().items()}
        counts: dict[tuple[str, str], int] = {}
        for family, listing in ((FAMILY, items), (BRIDGE_FAMILY, bridge_items or [])):
            for item in listing:
                if "chain" in item and (family, item["chain"]["name"]) in expected:
                    counts.setdefault((family, item["chain"]["name"]), 0)
                elif "rule" in item and (family, item["rule"]["chain"]) in expected:
                    counts[family, item["rule"]["chain"]] = counts.get((family, item["rule"]["chain"]), 0) + 1
        problems = []
        if bridge_items is None:
            problems.append(f"table {BRIDGE_FAMILY} {self.table} is missing")
        for (family, chain), want in expected.items():
            if family == BRIDGE_FAMILY and bridge_items is None:
                continue
            got = counts.get((family, chain))
            if got is None:
                problems.append(f"{family} chain {chain} is missing")
            elif got != want:
                problems.append(f"{family} chain {chain}: {got} rules, expected {want}")
        return agents, problems

    def reap_unowned_isolation_rules(
        self,
        live_addresses: Iterable[IPAddress | str] | None,
        subnet: str | ipaddress.IPv4Network | ipaddress.IPv6Network,
        only: Iterable[IPAddress | str] | None = None,
    ) -> list[str]:
        """Delete the rules of every agent address inside ``subnet`` that no live sandbox holds.

        ``live_addresses``: addresses held by live sandboxes across ALL scalers and consoles on
        this host, or ``None`` when that listing failed, in which case nothing is reaped. Addresses
        outside ``subnet`` (e.g. 172.30.0.0/16) are never touched; a failure to read the table reaps
        nothing. ``only``: when given, no address outside it is touched either (the caller's
        re-checked candidates, so rules written after its holder listing are never reaped). One
        transaction for all deletions. Returns the reaped addresses as strings, sorted.
        """
        if live_addresses is None:
            log.warning("reap skipped: the live address listing failed, so nothing is reaped")
            return []
        net = ipaddress.ip_network(subnet) if isinstance(subnet, str) else subnet
        live = {ipaddress.ip_address(a) if isinstance(a, str) else a for a in live_addresses}
        try:
            agents = self.list_agents()
        except NftError as exc:
            log.warning("reap skipped: could not list table %s: %s", self.table, exc)
            return []
        allowed = None if only is None else {ipaddress.ip_address(a) if isinstance(a, str) else a for a in only}
        stale = sorted(
            (
                a
                for a in agents
                if a.version == net.version and a in net and a not in live and (allowed is None or a in allowed)
            ),
            key=lambda a: (a.version, int(a)),
        )
        cmds: list[dict] = []
        for addr in stale:
            r = agents[addr]
            cmds += render_agent_remove(
                self.table,
                addr,
                mapped=[k for k, ok in (("fwd", r.mapped_forward), ("in", r.mapped_input)) if ok],
                chains=[k for k, ok in (("fwd", r.has_forward_chain), ("in", r.has_input_chain)) if ok],
                ports=r.ports,
            )
        self.apply_document(cmds)
        return [str(a) for a in stale]


def _agents_from(items: list[dict], bound: dict[IPAddress, list[str]]) -> dict[IPAddress, AgentRules]:
    """Agents from an ``nft -j list table inet`` array and the port bindings (see ``list_agents``)."""
    agents: dict[IPAddress, AgentRules] = {}
    for addr, ports in bound.items():
        agents[addr] = AgentRules(address=addr, ports=sorted(ports))

    def get(addr: IPAddress) -> AgentRules:
        if addr not in agents:
            agents[addr] = AgentRules(address=addr)
        return agents[addr]

    map_kinds = {name: kind for (kind, _), name in MAPS.items()}
    for item in items:
        if "chain" in item:
            parsed = parse_chain_name(item["chain"].get("name", ""))
            if parsed:
                addr, kind = parsed
                setattr(get(addr), "has_forward_chain" if kind == "fwd" else "has_input_chain", True)
        elif "rule" in item:
            parsed = parse_chain_name(item["rule"].get("chain", ""))
            if parsed:
                addr, kind = parsed
                rules = get(addr).forward if kind == "fwd" else get(addr).input
                rules.append(item["rule"].get("expr", []))
        elif "map" in item and item["map"].get("name") in map_kinds:
            kind = map_kinds[item["map"]["name"]]
            for elem in item["map"].get("elem", []):
                key, verdict = elem[0], elem[1]
                if isinstance(key, dict) and "elem" in key:  # element with options (timeouts, comments)
                    key = key["elem"].get("val")
                try:
                    addr = ipaddress.ip_address(key)
                except (ValueError, TypeError):
                    continue
                target = (verdict.get("jump") or verdict.get("goto") or {}).get("target", "")
                if parse_chain_name(target) == (addr, kind):
                    setattr(get(addr), "mapped_forward" if kind == "fwd" else "mapped_input", True)
                else:
                    # An element pointing somewhere unexpected still belongs to this address.
                    get(addr)
    return agents


def _port_pairs(items: list[dict]) -> dict[IPAddress, list[str]]:
    """Address → ports, from the elements of the port sets in an ``nft -j list`` array."""
    out: dict[IPAddress, list[str]] = {}
    for item in items:
        body = item.get("set")
        if not body or body.get("name") not in PORT_SETS.values():
            continue
        for elem in body.get("elem", []):
            if isinstance(elem, dict) and "elem" in elem:
                elem = elem["elem"].get("val")
            pair = elem.get("concat") if isinstance(elem, dict) else None
            if not pair or len(pair) != 2:
                continue
            try:
                addr = ipaddress.ip_address(pair[1])
            except (ValueError, TypeError):
                continue
            out.setdefault(addr, []).append(str(pair[0]))
    return out


def describe_agent_rules(client: NftClient, address: IPAddress | str) -> list[str]:
    """The rules in force for one agent, read back from the kernel, as human-readable lines.

    For the agent page. ``["no isolation rules in force for <addr>"]`` when the
    agent has none; listing failures raise NftError.
    """
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    agents = client.list_agents() or {}
    if addr not in agents:
        return [f"no isolation rules in force for {addr}"]
    return agents[addr].describe()
