"""Isolation rules rendered as nft commands (JSON), computed without touching the kernel: the base
(the ``inet`` table with its guard chains and the ``bridge`` table of the same name), the egress
baseline, one agent added or removed, or everything at once; :func:`document` wraps them for
``nft -j -f -``. Pure. The layout, the guard, the conntrack rule and the IPv6 policy are described
in ``docs/nft-isolation.md``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
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
    AGENT_PORTS_SET,
    BRIDGE_FAMILY,
    BRIDGE_FORWARD_CHAIN,
    BRIDGE_PORT_GUARD_CHAIN,
    BRIDGE_PREROUTING_CHAIN,
    FAMILY,
    FORWARD_CHAIN,
    GATEWAY_CHAIN,
    GATEWAY_CONNS_SETS,
    GATEWAY_PRIORITY,
    GUARD_NETS_SET,
    HOST_NETS_SETS,
    INPUT_CHAIN,
    MAP_TYPES,
    MAPS,
    NETDEV_FAMILY,
    PORT_SET_TYPES,
    PORT_SETS,
    PRIVATE_SET,
    guard_chain_name,
    policy_chain_name,
)
from .spec import AgentSpec, IPAddress, RuleSpecError, validate_ifname, validate_mac, validate_table_name

#: Hook priorities: the guard runs on the bridge's ingress; the bridge chains at ``filter``.
GUARD_PRIORITY = 0
BRIDGE_PRIORITY = -200
#: Bridge chain → (hook, priority). ``port-guard`` runs after every console's ``prerouting``
#: (same hook, later priority), so it sees the mark whichever table set it.
BRIDGE_HOOKS = {
    BRIDGE_PREROUTING_CHAIN: ("prerouting", BRIDGE_PRIORITY),
    BRIDGE_PORT_GUARD_CHAIN: ("prerouting", BRIDGE_PRIORITY + 10),
    BRIDGE_FORWARD_CHAIN: ("forward", BRIDGE_PRIORITY),
}


def _obj(kind: str, table: str, family: str = FAMILY, **attrs: Any) -> dict:
    return {kind: {"family": family, "table": table, **attrs}}


def _rule(table: str, chain: str, expr: list[dict]) -> dict:
    return {"add": _obj("rule", table, chain=chain, expr=expr)}


def _elem(table: str, map_name: str, elems: list, family: str = FAMILY) -> dict:
    return _obj("element", table, family, name=map_name, elem=elems)


def _port_elem(port: str, mac: str, address: IPAddress) -> dict:
    return {"concat": [port, mac, str(address)]}


def _guard_networks(networks: Iterable[str]) -> list[ipaddress.IPv4Network]:
    out = []
    for text in networks:
        try:
            out.append(ipaddress.IPv4Network(str(text), strict=True))
        except ValueError:
            raise RuleSpecError(f"guarded agent subnet {text!r} is not an IPv4 CIDR without host bits") from None
    return out


def _host_networks(networks: Iterable[Any]) -> dict[int, list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    """The host's connected subnets by IP version, merged (an interval set refuses overlaps).
    Host bits are cleared (``192.0.2.10/24`` is ``192.0.2.0/24``). Raises :class:`RuleSpecError`."""
    found: dict[int, list] = {4: [], 6: []}
    for item in networks:
        try:
            net = ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            raise RuleSpecError(f"host network {item!r} is not an IPv4 or IPv6 CIDR") from None
        found[net.version].append(net)
    return {v: list(ipaddress.collapse_addresses(nets)) for v, nets in found.items()}


def render_table_base(
    table: str,
    guard_interfaces: Iterable[str] = (),
    guard_networks: Iterable[str] = (),
    host_networks: Iterable[Any] | None = None,
) -> list[dict]:
    """Commands creating the three tables, their sets and maps, the base chains and the guard chains of
    each bridge in ``guard_interfaces`` (each must exist; ``guard_networks``: their IPv4 subnets),
    idempotent and re-runnable; ``host_networks``: the host's connected subnets for the ``hostnets``
    sets (None: left as they are). What is kept, flushed or only added: docs/nft-isolation.md ("Writing
    the base and an agent's rules"). Raises :class:`RuleSpecError` for a bad name or subnet. Returns a
    list of commands; wrap with :func:`document`.
    """
    validate_table_name(table)
    ifnames = [validate_ifname(name, "guarded bridge") for name in guard_interfaces]
    nets = _guard_networks(guard_networks)
    hosts = None if host_networks is None else _host_networks(host_networks)
    cmds: list[dict] = [{"add": {"table": {"family": FAMILY, "name": table}}}]
    for (_, version), name in MAPS.items():
        cmds.append({"add": _obj("map", table, name=name, type=MAP_TYPES[version], map="verdict")})
    cmds.append({"add": _obj("set", table, name=PRIVATE_SET, type="ipv4_addr", flags=["interval"])})
    cmds.append({"add": _elem(table, PRIVATE_SET, [_addr_right(n) for n in PRIVATE_DROPS])})
    for version, name in HOST_NETS_SETS.items():
        cmds.append({"add": _obj("set", table, name=name, type=MAP_TYPES[version], flags=["interval"])})
        if hosts is not None:
            cmds.append({"flush": _obj("set", table, name=name)})
            if hosts[version]:
                cmds.append({"add": _elem(table, name, [_addr_right(n) for n in hosts[version]])})
    for chain, hook in ((FORWARD_CHAIN, "forward"), (INPUT_CHAIN, "input")):
        cmds.append({"add": _obj("chain", table, name=chain, type="filter", hook=hook, prio=0, policy="accept")})
        cmds.append({"flush": _obj("chain", table, name=chain)})
    for chain, rules in base_rule_exprs().items():
        cmds += [_rule(table, chain, expr) for expr in rules]
    cmds += _guard_chains(table, FAMILY, ifnames)
    cmds += _bridge_base(table, nets)
    cmds.append({"add": {"table": {"family": NETDEV_FAMILY, "name": table}}})
    cmds += _guard_chains(table, NETDEV_FAMILY, ifnames)
    return cmds


def _guard_chains(table: str, family: str, ifnames: list[str]) -> list[dict]:
    """One guard chain per bridge in ``family`` (``inet``: IPv4 and IPv6 only; ``netdev``: every
    ethertype): ingress hook of the bridge, policy drop, marked frames accepted."""
    cmds: list[dict] = []
    for ifname in ifnames:
        chain = guard_chain_name(ifname)
        cmds.append(
            {"add": _obj("chain", table, family, name=chain, type="filter", hook="ingress", dev=ifname,
                         prio=GUARD_PRIORITY, policy="drop")}
        )  # fmt: skip
        cmds.append({"flush": _obj("chain", table, family, name=chain)})
        cmds += [{"add": _obj("rule", table, family, chain=chain, expr=expr)} for expr in guard_rule_exprs()]
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
    cmds.append({"add": _obj("set", table, b, name=AGENT_PORTS_SET, type="ifname")})
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
    re-running never duplicates. Isolation itself stays in the policy chains and the guard. Raises
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


#: Policy → its chains, so 1,000 agents of one label set cost one rendering (cleared when full).
_POLICY_CHAINS: dict[tuple, dict[str, tuple[str, list[list[dict]]]]] = {}
_POLICY_CACHE_SIZE = 1024


def policy_chains(spec: AgentSpec) -> dict[str, tuple[str, list[list[dict]]]]:
    """``{"fwd": (chain name, rules), "in": (chain name, rules)}``: the shared chains ``spec``'s
    agent jumps to. They depend on its policy only, never on its address; do not mutate."""
    key = (spec.gateway, spec.allowlist, spec.deny_all, spec.host_access)
    found = _POLICY_CHAINS.get(key)
    if found is None:
        if len(_POLICY_CHAINS) >= _POLICY_CACHE_SIZE:
            _POLICY_CHAINS.clear()
        fwd, inp = forward_rule_exprs(spec), input_rule_exprs(spec)
        found = _POLICY_CHAINS[key] = {"fwd": (policy_chain_name("fwd", fwd), fwd),
                                       "in": (policy_chain_name("in", inp), inp)}  # fmt: skip
    return found


def _chain_cmds(table: str, name: str, rules: list[list[dict]]) -> list[dict]:
    """Create (or flush and refill) one policy chain: in one transaction, so no moment without rules."""
    cmds: list[dict] = [{"add": _obj("chain", table, name=name)}, {"flush": _obj("chain", table, name=name)}]
    return cmds + [_rule(table, name, expr) for expr in rules]


def _jump(chain: str) -> dict:
    return {"jump": {"target": chain}}


def render_agent_add(table: str, spec: AgentSpec, replace: Sequence[str] = ()) -> list[dict]:
    """Commands that (re)write one agent's rules, map elements and (with ``spec.port``) its binding in
    one transaction; ``replace``: the kinds (``"fwd"``, ``"in"``) whose element exists pointing
    elsewhere, deleted first. Idempotent; needs the base (:func:`render_table_base`). Design:
    docs/nft-isolation.md ("Writing the base and an agent's rules").
    """
    validate_table_name(table)
    v = spec.address.version
    cmds: list[dict] = []
    for kind, (name, rules) in policy_chains(spec).items():
        cmds += _chain_cmds(table, name, rules)
        if kind in replace:
            cmds.append({"delete": _elem(table, MAPS[kind, v], [str(spec.address)])})
        cmds.append({"add": _elem(table, MAPS[kind, v], [[str(spec.address), _jump(name)]])})
    if spec.port:
        assert spec.mac, "AgentSpec.build gives a port only with its MAC"
        elem = _port_elem(spec.port, spec.mac, spec.address)
        cmds.append({"add": _elem(table, PORT_SETS[v], [elem], BRIDGE_FAMILY)})
        cmds.append({"add": _elem(table, AGENT_PORTS_SET, [spec.port], BRIDGE_FAMILY)})
    return cmds


def render_agent_remove(
    table: str,
    address: IPAddress | str,
    *,
    mapped: Sequence[str] = ("fwd", "in"),
    bindings: Sequence[tuple[str, str]] = (),
) -> list[dict]:
    """Commands unbinding one agent's ports and deleting its map elements: its rules stop applying
    and its frames stop passing the guard at once. Its policy chains may be shared and are left to
    :func:`render_chains_delete`.

    ``mapped`` restricts the deletes to the elements that exist (``"fwd"``, ``"in"``), and
    ``bindings`` names the bound ``(port, MAC)`` pairs, because one missing object fails the whole
    nft transaction; the applier reads the kernel to fill them in.
    """
    validate_table_name(table)
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    cmds: list[dict] = []
    if bindings:
        elems = [_port_elem(validate_ifname(p, "agent port"), validate_mac(m), addr) for p, m in bindings]
        cmds.append({"delete": _elem(table, PORT_SETS[addr.version], elems, BRIDGE_FAMILY)})
        # Added then deleted: the port leaves agent_ports whether or not its element was there.
        names = sorted({p for p, _ in bindings})
        cmds.append({"add": _elem(table, AGENT_PORTS_SET, names, BRIDGE_FAMILY)})
        cmds.append({"delete": _elem(table, AGENT_PORTS_SET, names, BRIDGE_FAMILY)})
    for kind in mapped:
        cmds.append({"delete": _elem(table, MAPS[kind, addr.version], [str(addr)])})
    return cmds


def render_chains_delete(table: str, chains: Iterable[str]) -> list[dict]:
    """Commands deleting policy chains no map element jumps to any more (flushed first). The
    kernel refuses to delete a chain still jumped to (EBUSY), failing the transaction: the
    applier sends one chain per transaction where another process may have taken it up."""
    validate_table_name(table)
    cmds: list[dict] = []
    for name in chains:
        cmds.append({"flush": _obj("chain", table, name=name)})
        cmds.append({"delete": _obj("chain", table, name=name)})
    return cmds


def render_agents(
    table: str, specs: Iterable[AgentSpec], replace: Mapping[IPAddress, Sequence[str]] | None = None
) -> list[dict]:
    """Commands writing many agents at once (:func:`render_agent_add` for each, in one list): each
    policy chain written once however many agents share it, map and port-set elements batched into
    one command per map or set. ``replace``: address → the kinds whose element exists with another
    verdict. Needs the base. Raises :class:`RuleSpecError` if two specs share an address.
    """
    validate_table_name(table)
    replace = replace or {}
    chains: dict[str, list[list[dict]]] = {}
    elems: dict[str, list] = {name: [] for name in MAPS.values()}
    port_elems: dict[str, list] = {name: [] for name in (*PORT_SETS.values(), AGENT_PORTS_SET)}
    deletes: dict[str, list] = {name: [] for name in MAPS.values()}
    seen: set[IPAddress] = set()
    for spec in specs:
        if spec.address in seen:
            raise RuleSpecError(f"agent address {spec.address} appears twice")
        seen.add(spec.address)
        v = spec.address.version
        for kind, (name, rules) in policy_chains(spec).items():
            chains.setdefault(name, rules)
            if kind in replace.get(spec.address, ()):
                deletes[MAPS[kind, v]].append(str(spec.address))
            elems[MAPS[kind, v]].append([str(spec.address), _jump(name)])
        if spec.port:
            assert spec.mac, "AgentSpec.build gives a port only with its MAC"
            port_elems[PORT_SETS[v]].append(_port_elem(spec.port, spec.mac, spec.address))
            port_elems[AGENT_PORTS_SET].append(spec.port)
    cmds: list[dict] = []
    for name, rules in chains.items():
        cmds += _chain_cmds(table, name, rules)
    for name, items in deletes.items():
        if items:
            cmds.append({"delete": _elem(table, name, items)})
    for name, items in elems.items():
        if items:
            cmds.append({"add": _elem(table, name, items)})
    for name, items in port_elems.items():
        if items:
            cmds.append({"add": _elem(table, name, items, BRIDGE_FAMILY)})
    return cmds


def render_gateway_cap(table: str, address: str, port: int, limit: int) -> list[dict]:
    """Commands capping at ``limit`` the connections one source address may hold open to the
    console's agent gateway ``address:port``: a new connection past it is reset (nft ``ct count``
    over a dynamic set of sources of the address's family), before any agent policy sees it. Its
    own chain, flushed and refilled: idempotent. Raises :class:`RuleSpecError` naming a bad
    address, port or limit."""
    validate_table_name(table)
    try:
        addr = ipaddress.ip_address(str(address))
    except ValueError:
        raise RuleSpecError(f"gateway address {address!r} is not an IPv4 or IPv6 address") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise RuleSpecError(f"gateway port {port!r} is not in 1-65535")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise RuleSpecError(f"gateway connection limit {limit!r} is not a positive whole number")
    proto = "ip" if addr.version == 4 else "ip6"
    conns = GATEWAY_CONNS_SETS[addr.version]
    rule = [
        _match(_payload(proto, "daddr"), str(addr)),
        _match(_payload("tcp", "dport"), port),
        _match({"ct": {"key": "state"}}, "new", "in"),
        {
            "set": {
                "op": "add",
                "elem": _payload(proto, "saddr"),
                "set": f"@{conns}",
                "stmt": [{"ct count": {"val": limit, "inv": True}}],
            }
        },
        {"counter": None},
        {"reject": {"type": "tcp reset"}},
    ]
    return [
        {"add": {"table": {"family": FAMILY, "name": table}}},
        # nft makes a set that a rule adds to dynamic by itself (its JSON has no such flag).
        {"add": _obj("set", table, name=conns, type=MAP_TYPES[addr.version], size=65535)},
        {
            "add": _obj(
                "chain", table, name=GATEWAY_CHAIN, type="filter", hook="input", prio=GATEWAY_PRIORITY, policy="accept"
            )
        },
        {"flush": _obj("chain", table, name=GATEWAY_CHAIN)},
        _rule(table, GATEWAY_CHAIN, rule),
    ]


def render_full(
    table: str,
    specs: Iterable[AgentSpec],
    guard_interfaces: Iterable[str] = (),
    guard_networks: Iterable[str] = (),
    replace: Mapping[IPAddress, Sequence[str]] | None = None,
    host_networks: Iterable[Any] | None = None,
) -> list[dict]:
    """Base plus every agent (:func:`render_agents`), as one transaction (self-heal, first apply,
    the bench). Raises :class:`RuleSpecError` for a bad name or subnet, or two specs sharing an
    address."""
    base = render_table_base(table, guard_interfaces, guard_networks, host_networks)
    return base + render_agents(table, specs, replace)


def document(commands: list[dict]) -> dict:
    """Wrap commands as the document ``nft -j -f -`` reads: ``{"nftables": [...]}``."""
    return {"nftables": list(commands)}
