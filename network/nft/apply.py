"""The one place that sends isolation rules to the kernel, for container and firecracker agents.

Every change is ONE JSON transaction, run in this process by libnftables (the library behind
``nft -j -f -``), so all of an agent's rules appear or none do. Reads are JSON listings
(``list table ...``) interpreted by map elements and chain names (``network.nft.names``), never by
matching rule text. Agents share policy chains; a chain no element jumps to any more is deleted
when its last agent goes, or by :meth:`NftClient.delete_unused_policy_chains`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings

from network.netlink import NetlinkError, host_networks
from network.nft.describe import describe_expr
from network.nft.exprs import base_rule_exprs, bridge_rule_exprs, guard_rule_exprs
from network.nft.libnft import DEFAULT_LIBRARY, LibraryUnavailableError, NftContext
from network.nft.names import (
    AGENT_PORTS_SET,
    BRIDGE_FAMILY,
    FAMILY,
    MAPS,
    NETDEV_FAMILY,
    PORT_SETS,
    guard_chain_name,
    parse_policy_chain_name,
)
from network.nft.render import (
    document,
    policy_chains,
    render_agent_add,
    render_agent_remove,
    render_chains_delete,
    render_egress_baseline,
    render_full,
    render_gateway_cap,
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

    @property
    def exists(self) -> bool:
        """True when nft refused to add an element that exists with other data (EEXIST)."""
        return "File exists" in self.stderr

    @property
    def busy(self) -> bool:
        """True when nft refused to delete a chain something still jumps to (EBUSY)."""
        return "Device or resource busy" in self.stderr


class NftUnavailableError(NftError):
    """nftables cannot be used here: libnftables is missing or the process lacks CAP_NET_ADMIN."""


@dataclass
class AgentRules:
    """One agent's rules as read back from the kernel. ``forward_chain``/``input_chain``: the chain its
    map element jumps to (None: no element); ``mapped_forward``/``mapped_input``: it jumps to a policy
    chain; ``has_forward_chain``/``has_input_chain``: that chain exists; ``forward``/``input``: its
    rules as nft JSON expression lists, in order (empty when missing; shared between agents of one
    policy: do not mutate). ``bindings``: the ``(port, MAC)`` pairs bound to the address (what the
    guard lets through); ``unguarded_ports``: those missing from ``agent_ports`` (a tampered set).
    """

    address: IPAddress
    forward: list[list[dict]] = field(default_factory=list)
    input: list[list[dict]] = field(default_factory=list)
    forward_chain: str | None = None
    input_chain: str | None = None
    has_forward_chain: bool = False
    has_input_chain: bool = False
    mapped_forward: bool = False
    mapped_input: bool = False
    bindings: list[tuple[str, str]] = field(default_factory=list)
    unguarded_ports: list[str] = field(default_factory=list)

    @property
    def ports(self) -> list[str]:
        """The bridge ports bound to the address."""
        return sorted({port for port, _ in self.bindings})

    @property
    def elements(self) -> list[str]:
        """The kinds (``"fwd"``, ``"in"``) with a map element for this address, whatever it jumps to."""
        return [k for k, c in (("fwd", self.forward_chain), ("in", self.input_chain)) if c is not None]

    @property
    def complete(self) -> bool:
        """Both map elements jump to policy chains of their kind, and both chains exist."""
        return self.has_forward_chain and self.has_input_chain and self.mapped_forward and self.mapped_input

    def rule_lines(self) -> list[str]:
        """The policy rules only, ``forward: ...`` then ``input: ...`` in chain order: what
        ``network.nft.plan.spec_rule_lines`` renders for a spec, to compare with it."""
        return [f"forward: {describe_expr(e)}" for e in self.forward] + [
            f"input: {describe_expr(e)}" for e in self.input
        ]

    def describe(self) -> list[str]:
        """Human-readable lines: the rules (:meth:`rule_lines`), the guard's port bindings, and a
        warning when the rules are not in force."""
        lines = self.rule_lines()
        lines += [
            f"guard: untagged frames from port {p}, MAC {m}, source {self.address} pass" for p, m in self.bindings
        ]
        kinds = (("forward", self.forward_chain, self.mapped_forward), ("input", self.input_chain, self.mapped_input))
        missing = [kind for kind, chain, _ in kinds if chain is None]
        if missing:
            lines.append(f"warning: not in the {' and '.join(missing)} map; these rules are not in force")
        for kind, chain, ours in kinds:
            if chain is not None and not ours:
                lines.append(f"warning: its {kind} map element jumps to chain {chain}, not to a policy chain; "
                             "these rules are not in force")  # fmt: skip
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

    def check_available(self) -> str:
        """Fail closed when nft cannot be used.

        Runs ``list tables`` and returns its JSON output. Raises :class:`NftUnavailableError`
        saying libnftables is missing or that the process lacks CAP_NET_ADMIN, or
        :class:`NftError` for anything else.
        """
        try:
            return self._run("list tables")
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

    def table_handles(self) -> str:
        """This console's tables as they are now, ``"<family>:<handle>"`` joined by commas (one
        ``list tables``, which is also :meth:`check_available`), "" when one of the three is
        missing. The kernel numbers tables as it makes them, so a table deleted and made again
        reads differently. Raises like :meth:`check_available`."""
        listed = json.loads(self.check_available() or "{}").get("nftables") or []
        handles = {
            t["table"]["family"]: t["table"]["handle"]
            for t in listed
            if "table" in t and t["table"].get("name") == self.table
        }
        families = (FAMILY, BRIDGE_FAMILY, NETDEV_FAMILY)
        if any(f not in handles for f in families):
            return ""
        return ",".join(f"{f}:{handles[f]}" for f in families)

    def trust_base(self) -> None:
        """Take the tables, their base chains and guards as in force without writing them (another
        process of this host just did, see ``scalers.backends.container.ready``): the first agent
        written by this client then skips :meth:`ensure_table`; a table gone meanwhile is still
        rebuilt by :meth:`apply_agent`."""
        self._base_ready = True

    def ensure_table(self, guard_interfaces: Iterable[str] = (), guard_networks: Iterable[str] = ()) -> None:
        """Create (or refresh) both tables, their maps and sets, the base chains and a guard chain per
        bridge in ``guard_interfaces`` (each must exist; ``guard_networks``: their IPv4 subnets); agent
        rules are kept and the host's subnets are read now (:meth:`host_networks`). Safe to call any
        number of times (docs/nft-isolation.md, "Writing the base and an agent's rules"). Raises
        RuleSpecError / NftError / NetlinkError.
        """
        self.apply_document(render_table_base(self.table, guard_interfaces, guard_networks, self.host_networks()))
        self.ensure_gateway_cap()
        self._base_ready = True

    def ensure_gateway_cap(self) -> None:
        """Cap the connections one source may hold to the console's agent gateway (the address and
        port of ``KICI_CONSOLE_URL``) at ``KICI_GATEWAY_CONNECTIONS_PER_SOURCE``
        (:func:`render_gateway_cap`); nothing when the URL's host is a name, not an address. The
        set of sources is made in the transaction of the rule that adds to it: only so does nft
        make it dynamic (its JSON has no such flag), which the rule needs; once made, adding it
        again is refused as existing, and the chain alone is refilled. A kernel that refuses the
        rule (no conntrack count) is logged, not raised: the isolation does not depend on it, and
        each gateway process caps a source's connections too (``kici_site.gateway``)."""
        url = urlsplit(settings.KICI_CONSOLE_URL)
        host = url.hostname or ""
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return
        limit = settings.KICI_GATEWAY_CONNECTIONS_PER_SOURCE
        cmds = render_gateway_cap(self.table, host, url.port or 80, limit)
        try:
            try:
                self.apply_document(cmds)
            except NftError as exc:
                if exc.exists:
                    self.apply_document([cmds[0], *cmds[2:]])
                else:
                    self._remake_sources_set(cmds, exc)
        except NftError as exc:
            log.warning("the gateway's connection cap was not written to table %s: %s", self.table, exc)

    def _remake_sources_set(self, cmds: list[dict], refused: NftError) -> None:
        """Make the gateway cap's set of sources again with its rule: one made without it (not
        dynamic) refuses the rule. Raises ``refused`` when there was no such set to remove."""
        made = cmds[1]["add"]["set"]
        try:
            self.apply_document([{"delete": {"set": {k: made[k] for k in ("family", "table", "name")}}}])
        except NftError:
            raise refused from None
        self.apply_document(cmds)

    def host_networks(self) -> list:
        """The connected subnets of the namespace the table is in (``network.netlink.host_networks``
        there), for the ``hostnets`` sets. Raises NetlinkError."""
        return host_networks(netns=self.netns)

    def ensure_egress(self, subnet: str, egress_interface: str, mss: int = 1460) -> None:
        """Masquerade and MSS clamp for a VM subnet leaving through ``egress_interface``
        (``render_egress_baseline``); idempotent. Raises RuleSpecError / NftError."""
        self.apply_document(render_egress_baseline(self.table, subnet, egress_interface, mss))

    def apply_agent(self, spec: AgentSpec) -> None:
        """Write (or replace) one agent's rules in one transaction; creates the base on first use.

        Its policy chains are flushed and refilled in the same transaction as its map elements,
        so there is no moment without rules and no duplicate after a repeat. An agent whose
        policy changed has elements jumping to its old chains: they are replaced in the same
        transaction, and the old chains deleted once nothing jumps to them. Raises NftError.
        """
        if not self._base_ready:
            self.ensure_table()
        try:
            self.apply_document(render_agent_add(self.table, spec))
            return
        except NftError as exc:
            if exc.exists:
                self._replace_agent(spec)
                return
            if not exc.missing_object:
                raise
        # The table vanished under us (deleted by hand, a host reboot of nft state): rebuild once.
        self.ensure_table()
        self.apply_document(render_agent_add(self.table, spec))

    def _replace_agent(self, spec: AgentSpec) -> None:
        current = self.list_agents().get(spec.address)
        replace = elements_to_replace(spec, current)
        self.apply_document(render_agent_add(self.table, spec, replace=replace))
        if current is not None:
            self._delete_chains_if_unused(current.forward_chain if k == "fwd" else current.input_chain for k in replace)

    def remove_agent(self, address: IPAddress | str) -> bool:
        """Unbind every port bound to one agent's address and delete its map elements, in one
        transaction (so its frames stop passing the guard the moment its rules go). Its policy
        chains may be shared: the next :meth:`delete_unused_policy_chains` (every drift check)
        deletes them once nothing jumps to them; they match no packet meanwhile.

        Missing table, chain or element is a no-op. Returns True when something was removed.
        Raises NftError for other failures.
        """
        addr = ipaddress.ip_address(address) if isinstance(address, str) else address
        bindings = self.bindings_of(addr)
        try:
            self.apply_document(render_agent_remove(self.table, addr, bindings=bindings))
            return True
        except NftError as exc:
            if not exc.missing_object:
                raise
        # Something is missing, and one missing object fails the whole transaction: read what
        # exists and delete only that.
        current = self.list_agents().get(addr)
        if current is None or not (current.elements or current.bindings):
            return False
        self.apply_document(render_agent_remove(self.table, addr, mapped=current.elements, bindings=current.bindings))
        return True

    def _delete_chains_if_unused(self, chains: Iterable[str | None]) -> list[str]:
        """Delete each policy chain in ``chains``, one transaction each, skipping one that is
        still jumped to (EBUSY: another agent of the policy) or already gone. Returns the deleted."""
        deleted = []
        for name in chains:
            if name is None or parse_policy_chain_name(name) is None:
                continue
            try:
                self.apply_document(render_chains_delete(self.table, [name]))
            except NftError as exc:
                if not (exc.busy or exc.missing_object):
                    raise
                continue
            deleted.append(name)
        return deleted

    def delete_unused_policy_chains(self, unused: Iterable[str] | None = None) -> list[str]:
        """Delete the policy chains of the table that no map element jumps to (left by removed
        agents or a policy change): ``unused`` as a :meth:`snapshot` found them, else read now.
        Returns the deleted names."""
        if unused is None:
            unused = _unused_policy_chains(self.list_table() or [])
        return self._delete_chains_if_unused(unused)

    def self_heal(
        self, specs: Iterable[AgentSpec], guard_interfaces: Iterable[str] = (), guard_networks: Iterable[str] = ()
    ) -> None:
        """Re-apply the base and every given agent in ONE transaction. Idempotent: twice in a row
        leaves exactly one copy of each rule. An element jumping to another chain than its spec's
        policy (a changed policy, a tampered map) is replaced in the same transaction. Agents not
        in ``specs`` are left alone (reaping is a separate decision).
        """
        specs = list(specs)
        hosts = self.host_networks()
        try:
            self.apply_document(render_full(self.table, specs, guard_interfaces, guard_networks, None, hosts))
        except NftError as exc:
            if not exc.exists:
                raise
            current = self.list_agents()
            replace = {spec.address: elements_to_replace(spec, current.get(spec.address)) for spec in specs}
            self.apply_document(render_full(self.table, specs, guard_interfaces, guard_networks, replace, hosts))
        self._base_ready = True

    def delete_table(self) -> bool:
        """Delete the three tables (tests, bench, decommissioning). All missing → False."""
        deleted = False
        for family in (FAMILY, BRIDGE_FAMILY, NETDEV_FAMILY):
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

    def bindings_of(self, address: IPAddress) -> list[tuple[str, str]]:
        """The ``(port, MAC)`` pairs bound to ``address`` (one ``list set`` of its family's binding
        set); [] when the bridge table or set is absent."""
        try:
            out = self._run(f"list set {BRIDGE_FAMILY} {self.table} {PORT_SETS[address.version]}")
        except NftError as exc:
            if exc.missing_object:
                return []
            raise
        return sorted(_port_pairs(json.loads(out).get("nftables", [])).get(address, []))

    def list_bindings(self) -> dict[IPAddress, list[tuple[str, str]]]:
        """Address → the ``(port, MAC)`` pairs bound to it in the bridge table's binding sets;
        ``{}`` when absent."""
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
        """Every agent with a map element or port binding in the tables, read back from the kernel.

        Ownership comes from elements only: the keys of ``agents{4,6}_{fwd,in}`` and the addresses
        in the bridge table's port sets; each agent's rules are those of the policy chains its
        elements jump to. Returns ``{}`` when the table is absent. Raises NftError when the
        listing fails (callers that must not act blind catch it).
        """
        return self.snapshot()[0]

    def snapshot(
        self, guard_interfaces: Iterable[str] = ()
    ) -> tuple[dict[IPAddress, AgentRules], list[str], list[str]]:
        """``(agents, base_problems, unused_chains)`` from one listing of each table: every agent
        as :meth:`list_agents` reads it; what is missing or changed in the base, each problem a
        line (``inet chain forward: 0 rules, expected 2``, ``inet chain guard-kici-br0 is
        missing``, ``table netdev kici is missing``), [] when the base is as rendered;
        the policy chains nothing jumps to. Raises NftError."""
        guard_interfaces = list(guard_interfaces)
        items = self.list_table()
        bridge_items = self.list_table(BRIDGE_FAMILY)
        if items is None:
            return {}, [f"table {FAMILY} {self.table} is missing"], []
        netdev_items = self.list_table(NETDEV_FAMILY)
        agents = _agents_from(items, _port_pairs(bridge_items or []), _set_strings(bridge_items or [], AGENT_PORTS_SET))
        expected = {(FAMILY, c): len(r) for c, r in base_rule_exprs().items()}
        expected |= {(FAMILY, guard_chain_name(i)): len(guard_rule_exprs()) for i in guard_interfaces}
        expected |= {(BRIDGE_FAMILY, c): len(r) for c, r in bridge_rule_exprs().items()}
        expected |= {(NETDEV_FAMILY, guard_chain_name(i)): len(guard_rule_exprs()) for i in guard_interfaces}
        counts: dict[tuple[str, str], int] = {}
        listings = ((FAMILY, items), (BRIDGE_FAMILY, bridge_items or []), (NETDEV_FAMILY, netdev_items or []))
        for family, listing in listings:
            for item in listing:
                if "chain" in item and (family, item["chain"]["name"]) in expected:
                    counts.setdefault((family, item["chain"]["name"]), 0)
                elif "rule" in item and (family, item["rule"]["chain"]) in expected:
                    counts[family, item["rule"]["chain"]] = counts.get((family, item["rule"]["chain"]), 0) + 1
        problems = []
        absent = [f for f, listing in ((BRIDGE_FAMILY, bridge_items), (NETDEV_FAMILY, netdev_items)) if listing is None]
        problems += [f"table {family} {self.table} is missing" for family in absent]
        for (family, chain), want in expected.items():
            if family in absent:
                continue
            got = counts.get((family, chain))
            if got is None:
                problems.append(f"{family} chain {chain} is missing")
            elif got != want:
                problems.append(f"{family} chain {chain}: {got} rules, expected {want}")
        return agents, problems, _unused_policy_chains(items)

    def reap_unowned_isolation_rules(
        self,
        live_addresses: Iterable[IPAddress | str] | None,
        subnet: str | ipaddress.IPv4Network | ipaddress.IPv6Network,
        only: Iterable[IPAddress | str] | None = None,
    ) -> list[str]:
        """Delete, in one transaction, the rules of every agent address inside ``subnet`` that no live
        sandbox holds. ``live_addresses``: held by live sandboxes of ALL scalers and consoles on this host,
        or ``None`` when that listing failed (then, as when the table cannot be read, nothing is reaped).
        ``only``: the caller's re-checked candidates; nothing outside them is touched, so rules written
        after its holder listing stay. Returns the reaped addresses, sorted (docs/address-holders.md).
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
            cmds += render_agent_remove(self.table, addr, mapped=r.elements, bindings=r.bindings)
        self.apply_document(cmds)
        if stale:
            self.delete_unused_policy_chains()
        return [str(a) for a in stale]


def elements_to_replace(spec: AgentSpec, found: AgentRules | None) -> list[str]:
    """The kinds (``"fwd"``, ``"in"``) whose map element for ``spec``'s address exists in ``found``
    (the kernel's reading) jumping to another chain than ``spec``'s policy chain: an add cannot
    overwrite them, so they are deleted and re-added in the same transaction."""
    if found is None:
        return []
    current = {"fwd": found.forward_chain, "in": found.input_chain}
    return [k for k, (name, _) in policy_chains(spec).items() if current[k] is not None and current[k] != name]


def _map_elements(items: list[dict]) -> list[tuple[str, IPAddress, str]]:
    """``(kind, address, jump target)`` of every element of the verdict maps in a listing."""
    map_kinds = {name: kind for (kind, _), name in MAPS.items()}
    out = []
    for item in items:
        if "map" not in item or item["map"].get("name") not in map_kinds:
            continue
        kind = map_kinds[item["map"]["name"]]
        for elem in item["map"].get("elem", []):
            key, verdict = elem[0], elem[1]
            if isinstance(key, dict) and "elem" in key:  # element with options (timeouts, comments)
                key = key["elem"].get("val")
            try:
                addr = ipaddress.ip_address(key)
            except (ValueError, TypeError):
                continue
            jump = (verdict.get("jump") or verdict.get("goto") or {}) if isinstance(verdict, dict) else {}
            target = jump.get("target", "")
            out.append((kind, addr, target))
    return out


def _unused_policy_chains(items: list[dict]) -> list[str]:
    """The policy chains of an ``inet`` listing that no map element jumps to."""
    jumped = {target for _, _, target in _map_elements(items)}
    return [
        item["chain"]["name"]
        for item in items
        if "chain" in item
        and parse_policy_chain_name(item["chain"].get("name", "")) is not None
        and item["chain"]["name"] not in jumped
    ]


def _agents_from(
    items: list[dict], bound: dict[IPAddress, list[tuple[str, str]]], guarded_ports: set[str] | None = None
) -> dict[IPAddress, AgentRules]:
    """Agents from an ``nft -j list table inet`` array, the port bindings and the ports in
    ``agent_ports`` (see ``list_agents``)."""
    agents: dict[IPAddress, AgentRules] = {}
    guarded = guarded_ports or set()
    for addr, pairs in bound.items():
        unguarded = sorted({p for p, _ in pairs if p not in guarded})
        agents[addr] = AgentRules(address=addr, bindings=sorted(pairs), unguarded_ports=unguarded)
    chains: dict[str, list[list[dict]]] = {}
    for item in items:
        if "chain" in item and parse_policy_chain_name(item["chain"].get("name", "")):
            chains.setdefault(item["chain"]["name"], [])
        elif "rule" in item and parse_policy_chain_name(item["rule"].get("chain", "")):
            chains.setdefault(item["rule"]["chain"], []).append(item["rule"].get("expr", []))
    for kind, addr, target in _map_elements(items):
        agent = agents.get(addr) or agents.setdefault(addr, AgentRules(address=addr))
        ours = parse_policy_chain_name(target) == kind
        exists = target in chains
        if kind == "fwd":
            agent.forward_chain, agent.mapped_forward, agent.has_forward_chain = target, ours, ours and exists
            agent.forward = chains.get(target, []) if ours else []
        else:
            agent.input_chain, agent.mapped_input, agent.has_input_chain = target, ours, ours and exists
            agent.input = chains.get(target, []) if ours else []
    return agents


def _set_strings(items: list[dict], name: str) -> set[str] | None:
    """The string elements of set ``name`` in an ``nft -j list`` array; None when it is absent."""
    for item in items:
        body = item.get("set")
        if body and body.get("name") == name:
            return {e for e in body.get("elem", []) if isinstance(e, str)}
    return None


def _port_pairs(items: list[dict]) -> dict[IPAddress, list[tuple[str, str]]]:
    """Address → ``(port, MAC)`` pairs, from the elements of the binding sets in an ``nft -j
    list`` array."""
    out: dict[IPAddress, list[tuple[str, str]]] = {}
    for item in items:
        body = item.get("set")
        if not body or body.get("name") not in PORT_SETS.values():
            continue
        for elem in body.get("elem", []):
            if isinstance(elem, dict) and "elem" in elem:
                elem = elem["elem"].get("val")
            triple = elem.get("concat") if isinstance(elem, dict) else None
            if not triple or len(triple) != 3:
                continue
            try:
                addr = ipaddress.ip_address(triple[2])
            except (ValueError, TypeError):
                continue
            out.setdefault(addr, []).append((str(triple[0]), str(triple[1]).lower()))
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
