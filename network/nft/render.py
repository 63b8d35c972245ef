"""Isolation rules rendered as nft commands (JSON), computed without touching the kernel: the base,
the egress baseline, one agent added or removed, or everything at once; :func:`document` wraps them
for ``nft -j -f -``. Pure.

Layout of one console's table (``inet <table>``; the name is the scaler's configured one, never a
literal, so two consoles on one host never touch each other's rules)::

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

    chain a4-172-30-0-5-fwd   (what the agent reaches THROUGH the host)
        ip daddr <gateway> accept
        ip daddr <allowlist entry> accept          (each, in order)
        ip daddr @private4 drop                    (RFC1918 + 169.254/16)
        drop                                       (denyAll)   -- or, without denyAll:
        meta nfproto ipv6 drop
        accept
    chain a4-172-30-0-5-in    (what the agent reaches ON the host)
        ct direction reply ct state established,related accept
        ip daddr A tcp dport P accept ; ip daddr A udp dport P accept    (each entry)
        drop

Conntrack on input accepts only the REPLY direction (the agent answering a connection the host
opened); a flow the agent opened is re-checked packet by packet against its entries, because a container runs for a
moment before its rules are written (see ``scalers.backends.container.spawn``) and a connection it opened
to a host port in that moment would otherwise stay open for good. An allowed entry passes every
packet of its flows anyway, so only flows the entries do not allow are affected.

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

Two shapes keep an agent's chains short: the four private-range drops are one lookup in the shared
``private4`` set (fewer rules per agent), and the forward chain ends with an explicit verdict (it
cannot fall through to the guard rule): ``meta nfproto ipv6 drop`` then ``accept``, or with
denyAll a single ``drop`` that closes both families.

The other modules of the package, one job each: :mod:`~network.nft.spec` (:class:`AgentSpec` and
input checks), :mod:`~network.nft.names` (object and chain names), :mod:`~network.nft.exprs` (rule
expressions) and :mod:`~network.nft.describe` (rules as nft-like text).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import Any

from .exprs import PRIVATE_DROPS, _addr_right, _match, _payload, base_rule_exprs, forward_rule_exprs, input_rule_exprs
from .names import FAMILY, FORWARD_CHAIN, GUARD_SET, INPUT_CHAIN, MAP_TYPES, MAPS, PRIVATE_SET, agent_chain_names
from .spec import AgentSpec, IPAddress, RuleSpecError, validate_table_name

_IFNAME = re.compile(r"[A-Za-z0-9_.\-]{1,15}", re.ASCII)


def _obj(kind: str, table: str, **attrs: Any) -> dict:
    return {kind: {"family": FAMILY, "table": table, **attrs}}


def _rule(table: str, chain: str, expr: list[dict]) -> dict:
    return {"add": _obj("rule", table, chain=chain, expr=expr)}


def _elem(table: str, map_name: str, elems: list) -> dict:
    return _obj("element", table, name=map_name, elem=elems)


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
        cmds.append({"add": _obj("chain", table, name=chain, type="filter", hook=hook, prio=0, policy="accept")})
        cmds.append({"flush": _obj("chain", table, name=chain)})
    for chain, rules in base_rule_exprs().items():
        cmds += [_rule(table, chain, expr) for expr in rules]
    return cmds


EGRESS_NAT_CHAIN = "postrouting"
EGRESS_MSS_CHAIN = "egress"


def render_egress_baseline(table: str, subnet: str, egress_interface: str, mss: int = 1460) -> list[dict]:
    """Commands for a VM bridge's way out, in the same table.

    Chain ``postrouting`` (nat hook, priority srcnat): ``ip saddr <subnet> oifname <egress>
    masquerade``. Chain ``egress`` (filter hook forward, priority mangle): ``ip saddr <subnet> tcp
    flags syn / syn,rst tcp option maxseg size set <mss>``. Both are flushed and refilled, so
    re-running never duplicates. Isolation itself stays in the agent chains and the guard. Raises
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
    for chain, kind, hook, prio in (
        (EGRESS_NAT_CHAIN, "nat", "postrouting", 100),
        (EGRESS_MSS_CHAIN, "filter", "forward", -150),
    ):
        cmds.append({"add": _obj("chain", table, name=chain, type=kind, hook=hook, prio=prio, policy="accept")})
        cmds.append({"flush": _obj("chain", table, name=chain)})
    cmds.append(
        _rule(table, EGRESS_NAT_CHAIN, [saddr, _match({"meta": {"key": "oifname"}}, ifname), {"masquerade": None}])
    )
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
    """Base plus every agent, as one transaction (self-heal, first apply, the bench).

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
