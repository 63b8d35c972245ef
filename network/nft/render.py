"""Isolation rules as nftables JSON, computed without touching the kernel (SPEC f, issue 5).

Layout of one console's table (``inet <table>``; the name is the scaler's configured one, never a
literal, so two consoles on one host never touch each other's rules — seed firecracker-backend.d.ts
``nftOpts``)::

    map agents4_fwd  ipv4_addr : verdict      agent address -> jump a4-<addr>-fwd
    map agents6_fwd  ipv6_addr : verdict      (IPv6-addressed agents)
    map agents4_in   ipv4_addr : verdict      agent address -> jump a4-<addr>-in
    map agents6_in   ipv6_addr : verdict
    set guard_ifaces ifname                   bridges agents sit behind
    set private4 ipv4_addr (interval)         10/8, 172.16/12, 192.168/16, 169.254/16

    chain forward  (filter hook forward priority 0, policy accept)
        ip saddr vmap @agents4_fwd
        ip6 saddr vmap @agents6_fwd
        iifname @guard_ifaces drop
    chain input    (filter hook input priority 0, policy accept)
        icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept
        ip saddr vmap @agents4_in
        ip6 saddr vmap @agents6_in
        iifname @guard_ifaces drop

    chain a4-172-30-0-5-fwd   (what the agent reaches THROUGH the host; SPEC f, NFT-01..03)
        ip daddr <gateway> accept
        ip daddr <allowlist entry> accept          (each, in order)
        ip daddr @private4 drop                    (RFC1918 + 169.254/16: NFT-01's four drops)
        drop                                       (denyAll)   -- or, without denyAll:
        meta nfproto ipv6 drop
        accept
    chain a4-172-30-0-5-in    (what the agent reaches ON the host; NFT-06..09)
        ct state established,related accept
        ip daddr A tcp dport P accept ; ip daddr A udp dport P accept    (each entry)
        drop

Per-packet cost is one hash lookup however many agents there are, and adding or removing an agent
touches only its two map elements and its two chains. Ownership is read from names: chain
``a4-172-30-0-5-fwd`` belongs to agent 172.30.0.5 (``a6-`` chains to IPv6 agents, ``:`` written as
``-``), never from rule text.

IPv6 policy (decided here, tested with packets in tests/test_isolation_packets.py):

* An agent is keyed by one address. Traffic from an address in no map that arrives on a guarded
  interface (the agents' bridge) is dropped on both hooks. This drops every IPv6 packet from an
  IPv4-keyed agent (its link-local and any other IPv6 source), and also spoofed or not yet
  registered IPv4 sources.
* Inside an agent's chains IPv6 is closed unless an entry names it: forward ends with
  ``meta nfproto ipv6 drop`` before its final accept; input ends with ``drop``. Only bracketed
  ``hostAccess`` entries and IPv6 allowlist entries produce IPv6 accepts; wildcard host-access
  entries (``*``, ``*:port``, a bare port) are rendered ``meta nfproto ipv4`` so they never open
  IPv6. IPv6 entries take effect for IPv6-keyed agents only.
* One exception on input: neighbour solicitations and advertisements with hop limit 255 (link-local
  by construction, never routed) are accepted from anyone, because without them the host cannot
  answer an IPv6 agent at all. They open no host service.

Divergences from the reference's rule text (not from its per-packet verdicts): the four
private-range drops are one lookup in the shared ``private4`` set (fewer rules per agent, so 1,000
agents apply in well under a second), and the forward chain ends with an explicit verdict (it
cannot fall through to the guard rule): ``meta nfproto ipv6 drop`` then ``accept``, or with
denyAll a single ``drop`` that closes both families.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from network.host_access import HostAccessEntry, HostAccessError, parse_host_access_entry

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

FAMILY = "inet"
FORWARD_CHAIN = "forward"
INPUT_CHAIN = "input"
GUARD_SET = "guard_ifaces"
PRIVATE_SET = "private4"
MAPS = {
    ("fwd", 4): "agents4_fwd",
    ("fwd", 6): "agents6_fwd",
    ("in", 4): "agents4_in",
    ("in", 6): "agents6_in",
}
MAP_TYPES = {4: "ipv4_addr", 6: "ipv6_addr"}

# Dropped on forward after the gateway and allowlist accepts (SPEC f, NFT-01): RFC1918 and
# link-local, which covers the 169.254.169.254 metadata service.
PRIVATE_DROPS = tuple(
    ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")
)

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", re.ASCII)
_CHAIN_NAME = re.compile(r"a([46])-([0-9a-f.\-]+)-(fwd|in)", re.ASCII)
_IFNAME = re.compile(r"[A-Za-z0-9_.\-]{1,15}", re.ASCII)


class RuleSpecError(ValueError):
    """Bad input to the renderer; the message names the field and the value."""


def validate_table_name(table: str) -> str:
    """Return ``table`` if it is a usable nft table name (letters, digits, ``_``, ``-``; ≤ 64).

    Raises :class:`RuleSpecError` naming the value otherwise.
    """
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise RuleSpecError(
            f"nft table name {table!r} is not usable: use letters, digits, '_' or '-', starting with a "
            "letter or '_', at most 64 characters"
        )
    return table


def parse_allowlist_entry(text: str) -> IPNetwork:
    """One ``networkPolicy.allowlist`` entry: an IPv4/IPv6 address or CIDR (no brackets, no port).

    Returns the network (a single address becomes /32 or /128). Raises :class:`RuleSpecError`
    naming the entry for anything else, including CIDRs with host bits set (``10.1.0.5/16``),
    which would otherwise be silently widened or narrowed.
    """
    if not isinstance(text, str):
        raise RuleSpecError(f"allowlist entry {text!r} must be a string, not {type(text).__name__}")
    value = text.strip()
    try:
        loose = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise RuleSpecError(
            f'allowlist entry "{text}" is not an IPv4/IPv6 address or CIDR (hostnames and ports are not accepted)'
        ) from None
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise RuleSpecError(
            f'allowlist entry "{text}" has host bits set: write "{loose}" for the network or '
            f'"{value.split("/")[0]}" for the one address'
        ) from None
    return net


@dataclass(frozen=True)
class AgentSpec:
    """Everything the rules for one agent depend on (SPEC f and g), already validated.

    ``address``: the agent's source address, the key of its map elements and chain names.
    ``gateway``: the bridge gateway (accepted on forward, NFT-01). ``allowlist``: networks accepted
    on forward ahead of the private-range drops, in order. ``deny_all``: drop everything else on
    forward. ``host_access``: the *resolved* entries (SPEC g.3), rendered on input in order.
    Build one with :meth:`build`, which validates every field first.
    """

    address: IPAddress
    gateway: IPAddress
    allowlist: tuple[IPNetwork, ...] = ()
    deny_all: bool = False
    host_access: tuple[HostAccessEntry, ...] = field(default=())

    @classmethod
    def build(
        cls,
        address: str,
        gateway: str,
        allowlist: Iterable[str] = (),
        deny_all: bool = False,
        host_access: Iterable[str] = (),
    ) -> AgentSpec:
        """Validate and build a spec from strings; raises :class:`RuleSpecError` naming the field.

        ``host_access`` entries are parsed with ``parse_host_access_entry``; a bad one raises
        ``RuleSpecError`` carrying its message, so nothing is rendered from a list with one bad entry.
        """
        try:
            addr = ipaddress.ip_address(str(address).strip())
        except ValueError:
            raise RuleSpecError(f"agent address {address!r} is not an IPv4 or IPv6 address") from None
        try:
            gw = ipaddress.ip_address(str(gateway).strip())
        except ValueError:
            raise RuleSpecError(f"gateway {gateway!r} is not an IPv4 or IPv6 address") from None
        if isinstance(allowlist, str):
            raise RuleSpecError(f"allowlist must be a list of addresses, not the string {allowlist!r}")
        if isinstance(host_access, str):
            raise RuleSpecError(f"hostAccess must be a list of entries, not the string {host_access!r}")
        nets = tuple(parse_allowlist_entry(e) for e in allowlist)
        entries = []
        for index, text in enumerate(host_access):
            try:
                entries.append(parse_host_access_entry(text))
            except HostAccessError as exc:
                raise RuleSpecError(f"hostAccess[{index}]: {exc}") from None
        if not isinstance(deny_all, bool):
            raise RuleSpecError(f"denyAll must be true or false, not {deny_all!r}")
        return cls(address=addr, gateway=gw, allowlist=nets, deny_all=deny_all, host_access=tuple(entries))


# ---------------------------------------------------------------------------------------------
# Names


def agent_key(address: IPAddress | str) -> str:
    """``a4-172-30-0-5`` / ``a6-fd00--5``: the name stem of an agent's chains (reversible)."""
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    if addr.version == 4:
        return "a4-" + str(addr).replace(".", "-")
    return "a6-" + str(addr).replace(":", "-")


def agent_chain_names(address: IPAddress | str) -> tuple[str, str]:
    """(forward chain, input chain) names for an agent address."""
    key = agent_key(address)
    return f"{key}-fwd", f"{key}-in"


def parse_chain_name(name: str) -> tuple[IPAddress, str] | None:
    """``("a4-172-30-0-5-fwd")`` → ``(IPv4Address('172.30.0.5'), "fwd")``; not an agent chain → None."""
    match = _CHAIN_NAME.fullmatch(name)
    if match is None:
        return None
    version, body, kind = match.groups()
    text = body.replace("-", "." if version == "4" else ":")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if addr.version != int(version) or agent_key(addr) + f"-{kind}" != name:
        return None
    return addr, kind


# ---------------------------------------------------------------------------------------------
# Expression builders (nft JSON schema 1, as nft 1.0.6 reads and prints it)


def _match(left: dict, right: Any, op: str = "==") -> dict:
    return {"match": {"op": op, "left": left, "right": right}}


def _payload(protocol: str, fld: str) -> dict:
    return {"payload": {"protocol": protocol, "field": fld}}


def _addr_right(net: IPNetwork) -> Any:
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


def _daddr(net: IPNetwork) -> dict:
    return _match(_payload("ip" if net.version == 4 else "ip6", "daddr"), _addr_right(net))


def _nfproto(family: str) -> dict:
    return _match({"meta": {"key": "nfproto"}}, family)


ACCEPT = {"accept": None}
DROP = {"drop": None}


def _as_net(addr: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(addr)


_PRIVATE_DROP = [_match(_payload("ip", "daddr"), f"@{PRIVATE_SET}"), DROP]
_V6_DROP = [_nfproto("ipv6"), DROP]
_CT_ACCEPT = [_match({"ct": {"key": "state"}}, ["established", "related"], op="in"), ACCEPT]


def forward_rule_exprs(spec: AgentSpec) -> list[list[dict]]:
    """The agent's forward chain, head to tail, as a list of expression lists (SPEC f, NFT-01..03).

    The four private-range drops of NFT-01 are one lookup in the table's ``private4`` interval set
    (10/8, 172.16/12, 192.168/16, 169.254/16): same verdict per packet, three fewer rules per
    agent. The returned lists are shared between agents with the same policy: do not mutate.
    """
    return _forward_rules(spec.gateway, spec.allowlist, spec.deny_all)


@functools.lru_cache(maxsize=256)
def _forward_rules(gateway: IPAddress, allowlist: tuple[IPNetwork, ...], deny_all: bool) -> list[list[dict]]:
    rules = [[_daddr(_as_net(gateway)), ACCEPT]]
    rules += [[_daddr(net), ACCEPT] for net in allowlist]
    rules.append(_PRIVATE_DROP)
    if deny_all:
        rules.append([DROP])
    else:
        rules.append(_V6_DROP)
        rules.append([ACCEPT])
    return rules


@functools.lru_cache(maxsize=1024)
def host_access_rule_exprs(entry: HostAccessEntry) -> list[list[dict]]:
    """Input rules for one entry (NFT-06, 08, 09): tcp and udp when it has a port, else one rule.

    Wildcard entries are restricted to IPv4 (``meta nfproto ipv4``); see the module doc.
    """
    head = [_nfproto("ipv4")] if entry.daddr is None else [_daddr(entry.daddr)]
    if entry.port is None:
        return [head + [ACCEPT]]
    return [head + [_match(_payload(proto, "dport"), entry.port), ACCEPT] for proto in ("tcp", "udp")]


def input_rule_exprs(spec: AgentSpec) -> list[list[dict]]:
    """The agent's input chain, head to tail (SPEC f, NFT-06..09): ct accept, entries, drop."""
    rules = [_CT_ACCEPT]
    for entry in spec.host_access:
        rules += host_access_rule_exprs(entry)
    rules.append([DROP])
    return rules


# ---------------------------------------------------------------------------------------------
# Documents


def _obj(kind: str, table: str, **attrs: Any) -> dict:
    return {kind: {"family": FAMILY, "table": table, **attrs}}


def _rule(table: str, chain: str, expr: list[dict]) -> dict:
    return {"add": _obj("rule", table, chain=chain, expr=expr)}


def _elem(table: str, map_name: str, elems: list) -> dict:
    return _obj("element", table, name=map_name, elem=elems)


def base_rule_exprs() -> dict[str, list[list[dict]]]:
    """Rules of the two base chains (see the module doc), by chain name."""

    def vmap(proto: str, name: str) -> list[dict]:
        return [{"vmap": {"key": _payload(proto, "saddr"), "data": f"@{name}"}}]

    guard = [_match({"meta": {"key": "iifname"}}, f"@{GUARD_SET}"), DROP]
    nd = [
        _match(_payload("icmpv6", "type"), {"set": ["nd-neighbor-solicit", "nd-neighbor-advert"]}),
        _match(_payload("ip6", "hoplimit"), 255),
        ACCEPT,
    ]
    return {
        FORWARD_CHAIN: [vmap("ip", MAPS["fwd", 4]), vmap("ip6", MAPS["fwd", 6]), guard],
        INPUT_CHAIN: [nd, vmap("ip", MAPS["in", 4]), vmap("ip6", MAPS["in", 6]), guard],
    }


def _validate_ifnames(names: Iterable[str]) -> list[str]:
    out = []
    for name in names:
        if not isinstance(name, str) or not _IFNAME.fullmatch(name):
            raise RuleSpecError(f"guard interface {name!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . -)")
        out.append(name)
    return out


def render_table_base(table: str, guard_interfaces: Iterable[str] = ()) -> list[dict]:
    """Commands creating the table, maps, guard set and base chains (idempotent, re-runnable).

    Existing agent chains and map elements are kept; the two base chains are flushed and refilled
    in the same transaction, so re-running never duplicates a base rule. ``guard_interfaces`` are
    added to ``guard_ifaces`` (never removed here, so two scalers sharing a table keep each
    other's bridges). Returns a list of commands; wrap with :func:`document`.
    """
    validate_table_name(table)
    ifnames = _validate_ifnames(guard_interfaces)
    cmds: list[dict] = [{"add": {"table": {"family": FAMILY, "name": table}}}]
    for (_, version), name in MAPS.items():
        cmds.append({"add": _obj("map", table, name=name, type=MAP_TYPES[version], map="verdict")})
    cmds.append({"add": _obj("set", table, name=GUARD_SET, type="ifname")})
    cmds.append({"add": _obj("set", table, name=PRIVATE_SET, type="ipv4_addr", flags=["interval"])})
    cmds.append({"add": _elem(table, PRIVATE_SET, [_addr_right(n) for n in PRIVATE_DROPS])})
    if ifnames:
        cmds.append({"add": _elem(table, GUARD_SET, ifnames)})
    for chain, hook in ((FORWARD_CHAIN, "forward"), (INPUT_CHAIN, "input")):
        cmds.append(
            {"add": _obj("chain", table, name=chain, type="filter", hook=hook, prio=0, policy="accept")}
        )
        cmds.append({"flush": _obj("chain", table, name=chain)})
    for chain, rules in base_rule_exprs().items():
        cmds += [_rule(table, chain, expr) for expr in rules]
    return cmds


EGRESS_NAT_CHAIN = "postrouting"
EGRESS_MSS_CHAIN = "egress"


def render_egress_baseline(table: str, subnet: str, egress_interface: str, mss: int = 1460) -> list[dict]:
    """Commands for a VM bridge's way out (SPEC f "Firecracker host baseline"), in the same table.

    Chain ``postrouting`` (nat hook, priority srcnat): ``ip saddr <subnet> oifname <egress>
    masquerade``. Chain ``egress`` (filter hook forward, priority mangle): ``ip saddr <subnet> tcp
    flags syn / syn,rst tcp option maxseg size set <mss>``. Both are flushed and refilled, so
    re-running never duplicates. Isolation itself stays in the agent chains and the guard; the
    reference's subnet-scoped ``baseline`` accepts/drops are covered by them. Raises
    :class:`RuleSpecError` for a bad subnet, interface or MSS.
    """
    validate_table_name(table)
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError:
        raise RuleSpecError(f"egress subnet {subnet!r} is not an IPv4 CIDR without host bits") from None
    (ifname,) = _validate_ifnames([egress_interface])
    if not isinstance(mss, int) or not 536 <= mss <= 65495:
        raise RuleSpecError(f"MSS {mss!r} must be an integer in 536-65495")
    saddr = _match(_payload("ip", "saddr"), _addr_right(net))
    syn = _match({"&": [_payload("tcp", "flags"), ["syn", "rst"]]}, "syn")
    clamp = {"mangle": {"key": {"tcp option": {"name": "maxseg", "field": "size"}}, "value": mss}}
    cmds: list[dict] = [{"add": {"table": {"family": FAMILY, "name": table}}}]
    for chain, kind, hook, prio in ((EGRESS_NAT_CHAIN, "nat", "postrouting", 100), (EGRESS_MSS_CHAIN, "filter", "forward", -150)):
        cmds.append({"add": _obj("chain", table, name=chain, type=kind, hook=hook, prio=prio, policy="accept")})
        cmds.append({"flush": _obj("chain", table, name=chain)})
    cmds.append(_rule(table, EGRESS_NAT_CHAIN, [saddr, _match({"meta": {"key": "oifname"}}, ifname), {"masquerade": None}]))
    cmds.append(_rule(table, EGRESS_MSS_CHAIN, [saddr, syn, clamp]))
    return cmds


def _agent_chain_cmds(table: str, spec: AgentSpec) -> list[dict]:
    fwd, inp = agent_chain_names(spec.address)
    cmds: list[dict] = []
    for chain in (fwd, inp):
        cmds.append({"add": _obj("chain", table, name=chain)})
        cmds.append({"flush": _obj("chain", table, name=chain)})
    cmds += [_rule(table, fwd, expr) for expr in forward_rule_exprs(spec)]
    cmds += [_rule(table, inp, expr) for expr in input_rule_exprs(spec)]
    return cmds


def _jump(chain: str) -> dict:
    return {"jump": {"target": chain}}


def render_agent_add(table: str, spec: AgentSpec) -> list[dict]:
    """Commands that (re)write one agent's rules: its two chains flushed and refilled, its two map
    elements added. Replaces any previous rules for the address in one transaction; applying it
    twice leaves exactly one copy. Needs the base (:func:`render_table_base`) to exist.
    """
    validate_table_name(table)
    fwd, inp = agent_chain_names(spec.address)
    v = spec.address.version
    cmds = _agent_chain_cmds(table, spec)
    cmds.append({"add": _elem(table, MAPS["fwd", v], [[str(spec.address), _jump(fwd)]])})
    cmds.append({"add": _elem(table, MAPS["in", v], [[str(spec.address), _jump(inp)]])})
    return cmds


def render_agent_remove(
    table: str,
    address: IPAddress | str,
    *,
    mapped: Sequence[str] = ("fwd", "in"),
    chains: Sequence[str] = ("fwd", "in"),
) -> list[dict]:
    """Commands deleting one agent's map elements, then its chains.

    ``mapped`` / ``chains`` restrict the deletes to what exists (``"fwd"``, ``"in"``), because one
    missing object fails the whole nft transaction; the applier reads the kernel to fill them in.
    """
    validate_table_name(table)
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    names = dict(zip(("fwd", "in"), agent_chain_names(addr), strict=True))
    cmds: list[dict] = []
    for kind in mapped:
        cmds.append({"delete": _elem(table, MAPS[kind, addr.version], [str(addr)])})
    for kind in chains:
        cmds.append({"flush": _obj("chain", table, name=names[kind])})
        cmds.append({"delete": _obj("chain", table, name=names[kind])})
    return cmds


def render_full(table: str, specs: Iterable[AgentSpec], guard_interfaces: Iterable[str] = ()) -> list[dict]:
    """Base plus every agent, as one transaction (self-heal, first apply, the 1,000-agent bench).

    Map elements are batched into one command per map. Raises :class:`RuleSpecError` if two
    specs share an address.
    """
    cmds = render_table_base(table, guard_interfaces)
    elems: dict[str, list] = {name: [] for name in MAPS.values()}
    seen: set[IPAddress] = set()
    for spec in specs:
        if spec.address in seen:
            raise RuleSpecError(f"agent address {spec.address} appears twice")
        seen.add(spec.address)
        cmds += _agent_chain_cmds(table, spec)
        fwd, inp = agent_chain_names(spec.address)
        elems[MAPS["fwd", spec.address.version]].append([str(spec.address), _jump(fwd)])
        elems[MAPS["in", spec.address.version]].append([str(spec.address), _jump(inp)])
    for name, items in elems.items():
        if items:
            cmds.append({"add": _elem(table, name, items)})
    return cmds


def document(commands: list[dict]) -> dict:
    """Wrap commands as the document ``nft -j -f -`` reads: ``{"nftables": [...]}``."""
    return {"nftables": list(commands)}


# ---------------------------------------------------------------------------------------------
# Human-readable form (for the agent page's "rules in force" and for test diagnostics)


def _describe_value(value: Any) -> str:
    if isinstance(value, dict) and "prefix" in value:
        return f"{value['prefix']['addr']}/{value['prefix']['len']}"
    if isinstance(value, dict) and "set" in value:
        return "{ " + ", ".join(_describe_value(v) for v in value["set"]) + " }"
    if isinstance(value, list):
        return ",".join(_describe_value(v) for v in value)
    return str(value)


def describe_expr(expr: list[dict]) -> str:
    """One rule's expressions in nft-like text, e.g. ``ip daddr 172.30.0.1 tcp dport 53 accept``.

    Only the shapes this module renders (and what nft prints back for them) are spelled out;
    anything else is shown as its JSON key.
    """
    words: list[str] = []
    for item in expr:
        if "match" in item:
            left, right = item["match"]["left"], item["match"]["right"]
            if "payload" in left:
                words.append(f"{left['payload']['protocol']} {left['payload']['field']}")
            elif "meta" in left:
                key = left["meta"]["key"]
                words.append(key if key in ("iifname", "oifname", "iif", "oif") else f"meta {key}")
            elif "ct" in left:
                words.append(f"ct {left['ct']['key']}")
            else:
                words.append(str(left))
            op = item["match"]["op"]
            if op not in ("==", "in"):
                words.append(op)
            words.append(_describe_value(right))
        elif "vmap" in item:
            key = item["vmap"]["key"]
            if "payload" in key:
                words.append(f"{key['payload']['protocol']} {key['payload']['field']}")
            words.append(f"vmap {item['vmap']['data']}")
        elif "jump" in item:
            words.append(f"jump {item['jump']['target']}")
        elif "goto" in item:
            words.append(f"goto {item['goto']['target']}")
        else:
            words.extend(item.keys())
    return " ".join(words)
