"""Isolation rules rendered as nft commands (JSON), computed without touching the kernel: the base
(the ``inet`` table with its guard chains and the ``bridge`` table of the same name), the egress
baseline, one agent added or removed, or everything at once; :func:`document` wraps them for
``nft -j -f -``. Pure. The layout, the guard, the conntrack rule and the IPv6 policy are described
in ``docs/nft-isolation.md``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

from .exprs import (
    PRIVATE_DROPS,
    _addr_right,
    _match,
    _payload,
    base_rule_exprs,
    bridge_rule_exprs,
    forward_rule_exprs,
    guard_rule_exprs,
    input_rule_exprs,
)
from .names import (
    BRIDGE_ARP_CHAIN,
    BRIDGE_FAMILY,
    BRIDGE_FORWARD_CHAIN,
    BRIDGE_PREROUTING_CHAIN,
    FAMILY,
    FORWARD_CHAIN,
    GUARD_NETS_SET,
    INPUT_CHAIN,
    MAP_TYPES,
    MAPS,
    PORT_SET_TYPES,
    PORT_SETS,
    PRIVATE_SET,
    agent_chain_names,
    guard_chain_name,
)
from .spec import AgentSpec, IPAddress, RuleSpecError, validate_ifname, validate_table_name

#: Hook priorities: the guard runs on the bridge's ingress; the bridge chains at ``filter``.
GUARD_PRIORITY = 0
BRIDGE_PRIORITY = -200
#: Bridge chain → (hook, priority). ``arp-guard`` runs after every console's ``prerouting``
#: (same hook, later priority), so it sees the mark whichever table set it.
BRIDGE_HOOKS = {
    BRIDGE_PREROUTING_CHAIN: ("prerouting", BRIDGE_PRIORITY),
    BRIDGE_ARP_CHAIN: ("prerouting", BRIDGE_PRIORITY + 10),
    BRIDGE_FORWARD_CHAIN: ("forward", BRIDGE_PRIORITY),
}


def _obj(kind: str, table: str, family: str = FAMILY, **attrs: Any) -> dict:
    return {kind: {"family": family, "table": table, **attrs}}


def _rule(table: str, chain: str, expr: list[dict]) -> dict:
    return {"add": _obj("rule", table, chain=chain, expr=expr)}


def _elem(table: str, map_name: str, elems: list, family: str = FAMILY) -> dict:
    return _obj("element", table, family, name=map_name, elem=elems)


def _port_elem(spec_port: str, address: IPAddress) -> dict:
    return {"concat": [spec_port, str(address)]}


def _guard_networks(networks: Iterable[str]) -> list[ipaddress.IPv4Network]:
    out = []
    for text in networks:
        try:
            out.append(ipaddress.IPv4Network(str(text), strict=True))
        except ValueError:
            raise RuleSpecError(f"guarded agent subnet {text!r} is not an IPv4 CIDR without host bits") from None
    return out


def render_table_base(
    table: str, guard_interfaces: Iterable[str] = (), guard_networks: Iterable[str] = ()
) -> list[dict]:
    """Commands creating both tables, their sets and maps, the base chains and one guard chain per
    bridge in ``guard_interfaces`` (idempotent, re-runnable).

    Existing agent chains, map and set elements are kept; every base and guard chain is flushed
    and refilled in the same transaction, so re-running never duplicates a rule and leaves no
    moment without one. ``guard_interfaces`` (bridges agents sit on; each must exist) and
    ``guard_networks`` (their IPv4 subnets) are added, never removed here, so scalers sharing a
    table keep each other's. Raises :class:`RuleSpecError` for a bad name or subnet. Returns a
    list of commands; wrap with :func:`document`.
    """
    validate_table_name(table)
    ifnames = [validate_ifname(name, "guarded bridge") for name in guard_interfaces]
    nets = _guard_networks(guard_networks)
    cmds: list[dict] = [{"add": {"table": {"family": FAMILY, "name": table}}}]
    for (_, version), name in MAPS.items():
        cmds.append({"add": _obj("map", table, name=name, type=MAP_TYPES[version], map="verdict")})
    cmds.append({"add": _obj("set", table, name=PRIVATE_SET, type="ipv4_addr", flags=["interval"])})
    cmds.append({"add": _elem(table, PRIVATE_SET, [_addr_right(n) for n in PRIVATE_DROPS])})
    for chain, hook in ((FORWARD_CHAIN, "forward"), (INPUT_CHAIN, "input")):
        cmds.append({"add": _obj("chain", table, name=chain, type="filter", hook=hook, prio=0, policy="accept")})
        cmds.append({"flush": _obj("chain", table, name=chain)})
    for chain, rules in base_rule_exprs().items():
        cmds += [_rule(table, chain, expr) for expr in rules]
    for ifname in ifnames:
        chain = guard_chain_name(ifname)
        cmds.append(
            {"add": _obj("chain", table, name=chain, type="filter", hook="ingress", dev=ifname,
                         prio=GUARD_PRIORITY, policy="drop")}
        )  # fmt: skip
        cmds.append({"flush": _obj("chain", table, name=chain)})
        cmds += [_rule(table, chain, expr) for expr in guard_rule_exprs()]
    cmds += _bridge_base(table, nets)
    return cmds


def _bridge_base(table: str, nets: list[ipaddress.IPv4Network]) -> list[dict]:
    b = BRIDGE_FAMILY
    cmds: list[dict] = [{"add": {"table": {"family": b, "name": table}}}]
    for version, name in PORT_SETS.items():
        cmds.append({"add": _obj("set", table, b, name=name, type=PORT_SET_TYPES[version])})
    cmds.append(
        {
            "add": _obj(
                "set", table, b, name=GUARD_NETS_SET, type="ipv4_addr", flags=["interval"], **{"auto-merge": True}
            )
        }
    )
    if nets:
        cmds.append({"add": _elem(table, GUARD_NETS_SET, [_addr_right(n) for n in nets], b)})
    for chain, rules in bridge_rule_exprs().items():
        hook, prio = BRIDGE_HOOKS[chain]
        cmds.append({"add": _obj("chain", table, b, name=chain, type="filter", hook=hook, prio=prio,
                                 policy="accept")})  # fmt: skip
        cmds.append({"flush": _obj("chain", table, b, name=chain)})
        cmds += [{"add": _obj("rule", table, b, chain=chain, expr=expr)} for expr in rules]
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
    ifname = validate_ifname(egress_interface, "egress interface")
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
    elements added, and (with ``spec.port``) its (port, address) pair bound, so the guard lets
    its frames through only in the same transaction that puts its rules in force. Replaces any
    previous rules for the address; applying it twice leaves exactly one copy. Needs the base
    (:func:`render_table_base`) to exist.
    """
    validate_table_name(table)
    fwd, inp = agent_chain_names(spec.address)
    v = spec.address.version
    cmds = _agent_chain_cmds(table, spec)
    cmds.append({"add": _elem(table, MAPS["fwd", v], [[str(spec.address), _jump(fwd)]])})
    cmds.append({"add": _elem(table, MAPS["in", v], [[str(spec.address), _jump(inp)]])})
    if spec.port:
        cmds.append({"add": _elem(table, PORT_SETS[v], [_port_elem(spec.port, spec.address)], BRIDGE_FAMILY)})
    return cmds


def render_agent_remove(
    table: str,
    address: IPAddress | str,
    *,
    mapped: Sequence[str] = ("fwd", "in"),
    chains: Sequence[str] = ("fwd", "in"),
    ports: Sequence[str] = (),
) -> list[dict]:
    """Commands unbinding one agent's ports, deleting its map elements, then its chains.

    ``mapped`` / ``chains`` restrict the deletes to what exists (``"fwd"``, ``"in"``), and
    ``ports`` names the bound ports, because one missing object fails the whole nft transaction;
    the applier reads the kernel to fill them in.
    """
    validate_table_name(table)
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    names = dict(zip(("fwd", "in"), agent_chain_names(addr), strict=True))
    cmds: list[dict] = []
    if ports:
        elems = [_port_elem(validate_ifname(p, "agent port"), addr) for p in ports]
        cmds.append({"delete": _elem(table, PORT_SETS[addr.version], elems, BRIDGE_FAMILY)})
    for kind in mapped:
        cmds.append({"delete": _elem(table, MAPS[kind, addr.version], [str(addr)])})
    for kind in chains:
        cmds.append({"flush": _obj("chain", table, name=names[kind])})
        cmds.append({"delete": _obj("chain", table, name=names[kind])})
    return cmds


def render_full(
    table: str, specs: Iterable[AgentSpec], guard_interfaces: Iterable[str] = (), guard_networks: Iterable[str] = ()
) -> list[dict]:
    """Base plus every agent, as one transaction (self-heal, first apply, the bench).

    Map and port-set elements are batched into one command per map or set. Raises
    :class:`RuleSpecError` if two specs share an address.
    """
    cmds = render_table_base(table, guard_interfaces, guard_networks)
    elems: dict[str, list] = {name: [] for name in MAPS.values()}
    port_elems: dict[str, list] = {name: [] for name in PORT_SETS.values()}
    seen: set[IPAddress] = set()
    for spec in specs:
        if spec.address in seen:
            raise RuleSpecError(f"agent address {spec.address} appears twice")
        seen.add(spec.address)
        cmds += _agent_chain_cmds(table, spec)
        fwd, inp = agent_chain_names(spec.address)
        elems[MAPS["fwd", spec.address.version]].append([str(spec.address), _jump(fwd)])
        elems[MAPS["in", spec.address.version]].append([str(spec.address), _jump(inp)])
        if spec.port:
            port_elems[PORT_SETS[spec.address.version]].append(_port_elem(spec.port, spec.address))
    for name, items in elems.items():
        if items:
            cmds.append({"add": _elem(table, name, items)})
    for name, items in port_elems.items():
        if items:
            cmds.append({"add": _elem(table, name, items, BRIDGE_FAMILY)})
    return cmds


def document(commands: list[dict]) -> dict:
    """Wrap commands as the document ``nft -j -f -`` reads: ``{"nftables": [...]}``."""
    return {"nftables": list(commands)}
