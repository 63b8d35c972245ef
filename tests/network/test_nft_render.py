"""Rule rendering as a pure function."""

from __future__ import annotations

import ipaddress
import json

import pytest

from network.nft.describe import describe_expr
from network.nft.exprs import forward_rule_exprs, input_rule_exprs
from network.nft.names import GUARD_MARK, MAPS, parse_policy_chain_name, policy_chain_name
from network.nft.render import (
    document,
    policy_chains,
    render_agent_add,
    render_agent_remove,
    render_chains_delete,
    render_full,
    render_table_base,
)
from network.nft.spec import AgentSpec, RuleSpecError, parse_allowlist_entry

GW = "172.30.0.1"
DROPS = ["ip daddr @private4 drop", "ip daddr @hostnets4 drop", "ip6 daddr @hostnets6 drop"]


def fwd(**kw):
    return [describe_expr(e) for e in forward_rule_exprs(AgentSpec.build("172.30.0.5", GW, **kw))]


def inp(host_access):
    return [describe_expr(e) for e in input_rule_exprs(AgentSpec.build("172.30.0.5", GW, host_access=host_access))]


def test_the_forward_chain_without_a_policy():
    assert fwd() == ["ip daddr 172.30.0.1 accept", *DROPS, "meta nfproto ipv6 drop", "accept"]


def test_allowlist_accepts_come_after_the_gateway_and_before_every_drop():
    rules = fwd(allowlist=["10.67.0.1/32", "100.64.0.7/32"])
    assert rules[:3] == ["ip daddr 172.30.0.1 accept", "ip daddr 10.67.0.1 accept", "ip daddr 100.64.0.7 accept"]
    assert rules[3:6] == DROPS


def test_deny_all_ends_the_forward_chain_with_a_drop():
    rules = fwd(deny_all=True)
    assert rules[-1] == "drop"
    assert "accept" not in rules


def test_the_input_chain_for_dns_and_the_console_port():
    assert inp(["172.30.0.1:53", "*:4000"]) == [
        "ct direction reply ct state established,related accept",
        "ip daddr 172.30.0.1 tcp dport 53 accept",
        "ip daddr 172.30.0.1 udp dport 53 accept",
        "meta nfproto ipv4 tcp dport 4000 accept",
        "meta nfproto ipv4 udp dport 4000 accept",
        "drop",
    ]


def test_an_empty_host_access_leaves_only_replies():
    assert inp([]) == ["ct direction reply ct state established,related accept", "drop"]


def test_an_address_without_a_port_is_one_rule():
    assert inp(["192.168.1.40"]) == [
        "ct direction reply ct state established,related accept",
        "ip daddr 192.168.1.40 accept",
        "drop",
    ]


def test_a_star_opens_the_whole_host_on_ipv4_only():
    assert inp(["*"]) == ["ct direction reply ct state established,related accept", "meta nfproto ipv4 accept", "drop"]


def test_ipv6_entries_render_ip6_matches():
    assert inp(["[fd00::/64]:443", "[fd00::1]"]) == [
        "ct direction reply ct state established,related accept",
        "ip6 daddr fd00::/64 tcp dport 443 accept",
        "ip6 daddr fd00::/64 udp dport 443 accept",
        "ip6 daddr fd00::1 accept",
        "drop",
    ]


def test_an_ipv6_agent_gets_ip6_gateway_and_allowlist_rules():
    spec = AgentSpec.build("fd13::7", "fd13::1", allowlist=["fd99::/48"])
    assert [describe_expr(e) for e in forward_rule_exprs(spec)][:2] == [
        "ip6 daddr fd13::1 accept",
        "ip6 daddr fd99::/48 accept",
    ]
    # The policy chains do not depend on the agent's address: an IPv6 agent of the same policy shares them.
    assert policy_chains(spec) == policy_chains(AgentSpec.build("fd13::8", "fd13::1", allowlist=["fd99::/48"]))


def commands_touching(cmds, table):
    """Every (verb, kind, name) in a command list; asserts each names ``table``."""
    out = []
    for cmd in cmds:
        ((verb, body),) = cmd.items()
        ((kind, obj),) = body.items()
        assert obj.get("table", obj.get("name")) == table or kind == "table" and obj["name"] == table
        out.append((verb, kind, obj.get("name") or obj.get("chain")))
    return out


def test_adding_an_agent_touches_only_its_policy_chains_and_map_elements():
    spec = AgentSpec.build("172.30.0.5", GW, host_access=["*:4000"])
    chains = policy_chains(spec)
    fwd_chain, in_chain = chains["fwd"][0], chains["in"][0]
    assert fwd_chain.startswith("pol-fwd-") and in_chain.startswith("pol-in-")
    touched = commands_touching(render_agent_add("kici_a", spec), "kici_a")
    assert {name for _, _, name in touched} == {fwd_chain, in_chain, MAPS["fwd", 4], MAPS["in", 4]}
    elems = [c["add"]["element"] for c in render_agent_add("kici_a", spec) if "element" in c.get("add", {})]
    assert [e["elem"] for e in elems] == [
        [["172.30.0.5", {"jump": {"target": fwd_chain}}]],
        [["172.30.0.5", {"jump": {"target": in_chain}}]],
    ]
    # Replacing = flush + refill in the same document, so a repeat cannot duplicate.
    assert ("flush", "chain", fwd_chain) in touched and ("flush", "chain", in_chain) in touched
    assert not any(verb == "delete" for verb, _, _ in touched)
    # An element jumping elsewhere (a changed policy) is deleted and re-added in the same document.
    replaced = commands_touching(render_agent_add("kici_a", spec, replace=["in"]), "kici_a")
    assert replaced.index(("delete", "element", MAPS["in", 4])) + 1 == replaced.index(("add", "element", MAPS["in", 4]))
    assert ("delete", "element", MAPS["fwd", 4]) not in replaced


def test_agents_share_policy_chains_exactly_when_their_rules_are_equal():
    a = AgentSpec.build("172.30.0.5", GW, host_access=["*:4000"], port="veth1", mac="02:4b:43:00:00:05")
    b = AgentSpec.build("172.30.0.6", GW, host_access=["*:4000"], port="veth2", mac="02:4b:43:00:00:06")
    c = AgentSpec.build("172.30.0.7", GW, host_access=["*:4001"])
    assert policy_chains(a) == policy_chains(b)
    assert policy_chains(a)["fwd"] == policy_chains(c)["fwd"] and policy_chains(a)["in"] != policy_chains(c)["in"]
    assert policy_chains(a)["in"][0] == policy_chain_name("in", input_rule_exprs(a))
    # One chain per policy in a full render, however many agents use it.
    chains = [c["add"]["chain"]["name"] for c in render_full("kici", [a, b, c]) if "chain" in c.get("add", {})]
    policy = [name for name in chains if parse_policy_chain_name(name)]
    assert sorted(policy) == sorted({policy_chains(x)[k][0] for x in (a, c) for k in ("fwd", "in")})


def test_removing_an_agent_touches_only_its_map_elements_and_ports():
    removed = render_agent_remove("kici_b", "172.30.0.9", bindings=[("veth9", "02:4b:43:00:00:09")])
    touched = commands_touching(removed, "kici_b")
    assert touched[3:] == [("delete", "element", MAPS["fwd", 4]), ("delete", "element", MAPS["in", 4])]
    # The port leaves agent_ports by an add then a delete: no missing element can fail the transaction.
    assert touched[:3] == [
        ("delete", "element", "bind4"),
        ("add", "element", "agent_ports"),
        ("delete", "element", "agent_ports"),
    ]
    assert render_agent_remove("kici_b", "172.30.0.9", mapped=("in",)) == [
        {"delete": {"element": {"family": "inet", "table": "kici_b", "name": MAPS["in", 4], "elem": ["172.30.0.9"]}}}
    ]
    name = policy_chains(AgentSpec.build("172.30.0.9", GW))["in"][0]
    assert commands_touching(render_chains_delete("kici_b", [name]), "kici_b") == [
        ("flush", "chain", name),
        ("delete", "chain", name),
    ]


def test_the_table_is_the_configured_one_everywhere():
    specs = [AgentSpec.build(f"172.30.0.{i}", GW, host_access=["*:4000"]) for i in (5, 6)]
    text = json.dumps(document(render_full("console_b", specs, ["kici-br0"])))
    assert '"kici"' not in text
    for cmds in (
        render_table_base("console_b"),
        render_agent_add("console_b", specs[0]),
        render_agent_remove("console_b", "172.30.0.5"),
    ):
        commands_touching(cmds, "console_b")


def test_the_private_set_holds_rfc1918_link_local_and_shared_address_space():
    cmds = render_table_base("kici")
    elems = [c["add"]["element"] for c in cmds if "element" in c.get("add", {})]
    assert elems == [
        {
            "family": "inet",
            "table": "kici",
            "name": "private4",
            "elem": [
                {"prefix": {"addr": "10.0.0.0", "len": 8}},
                {"prefix": {"addr": "172.16.0.0", "len": 12}},
                {"prefix": {"addr": "192.168.0.0", "len": 16}},
                {"prefix": {"addr": "169.254.0.0", "len": 16}},
                {"prefix": {"addr": "100.64.0.0", "len": 10}},
            ],
        }
    ]


def test_the_host_networks_sets_are_flushed_and_refilled_with_the_hosts_connected_subnets():
    """Pure: the host's addresses are passed in (host bits cleared, overlaps merged per family)."""
    hosts = ["198.51.100.7/24", "198.51.100.9/24", "203.0.113.0/25", "203.0.113.128/25", "2001:db8:5::10/64"]
    cmds = render_table_base("kici", host_networks=hosts)
    flushed = [c["flush"]["set"]["name"] for c in cmds if "set" in c.get("flush", {})]
    elems = {c["add"]["element"]["name"]: c["add"]["element"]["elem"] for c in cmds if "element" in c.get("add", {})}
    assert flushed == ["hostnets4", "hostnets6"]
    assert elems["hostnets4"] == [
        {"prefix": {"addr": "198.51.100.0", "len": 24}},
        {"prefix": {"addr": "203.0.113.0", "len": 24}},
    ]
    assert elems["hostnets6"] == [{"prefix": {"addr": "2001:db8:5::", "len": 64}}]
    # None leaves the sets' elements as they are (a caller that did not read the host's addresses).
    assert not [c for c in render_table_base("kici") if "set" in c.get("flush", {})]
    with pytest.raises(RuleSpecError, match="host network 'lan0' is not an IPv4 or IPv6 CIDR"):
        render_table_base("kici", host_networks=["lan0"])


def _rules_by_chain(cmds):
    rules = {}
    for c in cmds:
        if "rule" in c.get("add", {}):
            r = c["add"]["rule"]
            rules.setdefault((r["family"], r["chain"]), []).append(describe_expr(r["expr"]))
    return rules


def test_the_base_chains_jump_through_verdict_maps_and_leave_unknown_sources_to_the_guard():
    rules = _rules_by_chain(render_table_base("kici", ["kici-br0"], ["10.0.0.0/24"]))
    # No drop on the inet hooks: an address in no map is another console's agent (its own table
    # judges it) or not from an agent bridge at all; unknown sources never get past the guard.
    assert rules["inet", "forward"] == ["ip saddr vmap @agents4_fwd", "ip6 saddr vmap @agents6_fwd"]
    assert rules["inet", "input"][1:] == ["ip saddr vmap @agents4_in", "ip6 saddr vmap @agents6_in"]
    assert rules["inet", "input"][0].startswith("icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert }")


def test_each_guarded_bridge_gets_an_ingress_chain_that_drops_unless_marked():
    cmds = render_table_base("kici", ["kici-br0", "kici-agent-net"], ["10.0.0.0/24"])
    chains = [
        c["add"]["chain"] for c in cmds if "chain" in c.get("add", {}) and c["add"]["chain"].get("hook") == "ingress"
    ]
    assert [(c["family"], c["name"], c["dev"], c["policy"]) for c in chains] == [
        (family, f"guard-{bridge}", bridge, "drop")
        for family in ("inet", "netdev")
        for bridge in ("kici-br0", "kici-agent-net")
    ]
    rules = _rules_by_chain(cmds)
    assert rules["inet", "guard-kici-br0"] == [f"meta mark & {GUARD_MARK:#x} {GUARD_MARK:#x} accept"]
    flushed = [(c["flush"]["chain"]["family"], c["flush"]["chain"]["name"]) for c in cmds if "flush" in c]
    assert flushed == [
        ("inet", "forward"),
        ("inet", "input"),
        ("inet", "guard-kici-br0"),
        ("inet", "guard-kici-agent-net"),
        ("bridge", "prerouting"),
        ("bridge", "port-guard"),
        ("bridge", "forward"),
        ("netdev", "guard-kici-br0"),
        ("netdev", "guard-kici-agent-net"),
    ]


def test_the_bridge_table_marks_bound_untagged_frames_and_never_bridges_agent_frames():
    cmds = render_table_base("kici", ["kici-br0"], ["10.0.0.0/24"])
    rules = _rules_by_chain(cmds)
    assert len(rules["bridge", "prerouting"]) == 3  # ip, arp, ip6: each by (iifname, MAC, saddr), untagged
    mark = f"meta mark set meta mark | {GUARD_MARK:#x}"
    assert rules["bridge", "prerouting"][0] == f"ether type ip iifname . ether saddr . ip saddr @bind4 {mark}"
    assert rules["bridge", "prerouting"][1].startswith("ether type arp arp htype 1 ")
    assert "iifname . arp saddr ether . arp saddr ip @bind4" in rules["bridge", "prerouting"][1]
    assert rules["bridge", "prerouting"][2] == f"ether type ip6 iifname . ether saddr . ip6 saddr @bind6 {mark}"
    assert len(rules["bridge", "forward"]) == 8 and all(r.endswith("drop") for r in rules["bridge", "forward"])
    assert rules["bridge", "forward"][:2] == ["iifname @agent_ports drop", "oifname @agent_ports drop"]
    # Everything unmarked from a bound port, and unmarked agent-subnet ARP from any port, is
    # dropped after every console's marking chain (same hook, later priority).
    unmarked = f"meta mark & {GUARD_MARK:#x} != {GUARD_MARK:#x} drop"
    assert rules["bridge", "port-guard"] == [
        f"iifname @agent_ports {unmarked}",
        f"arp saddr ip @guard_nets4 {unmarked}",
    ]
    # The netdev guard sees every ethertype going up to the host (ARP, tagged frames): policy drop.
    assert rules["netdev", "guard-kici-br0"] == [f"meta mark & {GUARD_MARK:#x} {GUARD_MARK:#x} accept"]
    chains = [c["add"]["chain"] for c in cmds if "hook" in c.get("add", {}).get("chain", {})]
    hooks = {(c["family"], c["name"]): (c["hook"], c["prio"], c["policy"]) for c in chains}
    assert hooks == {
        ("inet", "forward"): ("forward", 0, "accept"),
        ("inet", "input"): ("input", 0, "accept"),
        ("inet", "guard-kici-br0"): ("ingress", 0, "drop"),
        ("bridge", "prerouting"): ("prerouting", -200, "accept"),
        ("bridge", "port-guard"): ("prerouting", -190, "accept"),
        ("bridge", "forward"): ("forward", -200, "accept"),
        ("netdev", "guard-kici-br0"): ("ingress", 0, "drop"),
    }
    nets = [c["add"]["element"] for c in cmds if c.get("add", {}).get("element", {}).get("name") == "guard_nets4"]
    assert nets == [
        {
            "family": "bridge",
            "table": "kici",
            "name": "guard_nets4",
            "elem": [{"prefix": {"addr": "10.0.0.0", "len": 24}}],
        }
    ]
    with pytest.raises(RuleSpecError, match="guarded agent subnet '10.0.0.1/24'"):
        render_table_base("kici", [], ["10.0.0.1/24"])
    with pytest.raises(RuleSpecError, match="guarded bridge 'a bridge'"):
        render_table_base("kici", ["a bridge"])


def test_an_agent_with_a_port_is_bound_with_its_mac_in_the_same_transaction_as_its_rules():
    spec = AgentSpec.build("10.0.0.5", "10.0.0.1", port="veth1a2b", mac="06:00:AC:00:00:05")
    assert spec.mac == "06:00:ac:00:00:05"
    cmds = render_agent_add("kici", spec)
    bridge = [c["add"]["element"] for c in cmds if c.get("add", {}).get("element", {}).get("family") == "bridge"]
    triple = {"concat": ["veth1a2b", "06:00:ac:00:00:05", "10.0.0.5"]}
    assert bridge == [
        {"family": "bridge", "table": "kici", "name": "bind4", "elem": [triple]},
        {"family": "bridge", "table": "kici", "name": "agent_ports", "elem": ["veth1a2b"]},
    ]
    removed = render_agent_remove("kici", "10.0.0.5", bindings=[("veth1a2b", "06:00:ac:00:00:05")])
    assert removed[0] == {
        "delete": {"element": {"family": "bridge", "table": "kici", "name": "bind4", "elem": [triple]}}
    }
    with pytest.raises(RuleSpecError, match="agent port 'no such port!'"):
        AgentSpec.build("10.0.0.5", "10.0.0.1", port="no such port!", mac="06:00:ac:00:00:05")


@pytest.mark.parametrize(
    ("port", "mac", "message"),
    [
        ("veth1", None, "agent port 'veth1' needs the agent's MAC"),
        (None, "02:4b:43:00:00:01", "agent MAC '02:4b:43:00:00:01' needs its port"),
        ("veth1", "02:4b:43:00:00", "agent MAC '02:4b:43:00:00' is not a unicast MAC"),
        ("veth1", "03:4b:43:00:00:01", "agent MAC '03:4b:43:00:00:01' is not a unicast MAC"),
    ],
)
def test_a_port_binding_needs_a_unicast_mac(port, mac, message):
    with pytest.raises(RuleSpecError, match=message):
        AgentSpec.build("10.0.0.5", "10.0.0.1", port=port, mac=mac)


def test_a_full_render_batches_map_elements_and_refuses_duplicates():
    specs = [AgentSpec.build(f"172.30.{i // 250}.{i % 250 + 2}", GW) for i in range(600)]
    cmds = render_full("kici", specs)
    elements = [c["add"]["element"] for c in cmds if c.get("add", {}).get("element", {}).get("name") in MAPS.values()]
    assert [len(e["elem"]) for e in elements] == [600, 600]
    with pytest.raises(RuleSpecError, match="appears twice"):
        render_full("kici", [specs[0], specs[0]])


def test_policy_chain_names_are_read_back_and_foreign_names_are_not_policy_chains():
    rules = input_rule_exprs(AgentSpec.build("172.30.0.5", GW, host_access=["*:4000"]))
    assert parse_policy_chain_name(policy_chain_name("in", rules)) == "in"
    assert parse_policy_chain_name(policy_chain_name("fwd", rules)) == "fwd"
    assert policy_chain_name("in", rules) != policy_chain_name("in", rules[1:])
    for name in ("forward", "input", "guard-kici-br0", "pol-in-", "pol-in-0123", "pol-in-0123456789abcdef0",
                 "pol-out-0123456789abcdef", "pol-in-0123456789ABCDEF", "a4-172-30-0-5-fwd"):  # fmt: skip
        assert parse_policy_chain_name(name) is None


@pytest.mark.parametrize("table", ["", "kici table", "1kici", "k;i", "x" * 65, None])
def test_it_refuses_unusable_table_names(table):
    with pytest.raises(RuleSpecError, match="nft table name"):
        render_table_base(table)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"address": "172.30.0.0/24"}, "agent address"),
        ({"address": "agent-1"}, "agent address"),
        ({"gateway": "gw"}, "gateway"),
        ({"allowlist": ["example.com"]}, 'allowlist entry "example.com"'),
        ({"allowlist": ["10.1.0.5/16"]}, "host bits set"),
        ({"allowlist": "10.0.0.0/8"}, "allowlist must be a list"),
        ({"host_access": ["registry.internal:5000"]}, r"hostAccess\[0\]: hostAccess entry \"registry.internal:5000\""),
        ({"host_access": ["*:4000", "*:0"]}, r"hostAccess\[1\].*outside 1-65535"),
        ({"deny_all": "yes"}, "denyAll"),
    ],
)
def test_bad_specs_are_refused_before_anything_is_rendered(kwargs, message):
    args = {"address": "172.30.0.5", "gateway": GW, **kwargs}
    with pytest.raises(RuleSpecError, match=message):
        AgentSpec.build(**args)


def test_allowlist_entries_accept_addresses_and_cidrs_of_both_families():
    assert parse_allowlist_entry("10.67.0.1") == ipaddress.ip_network("10.67.0.1/32")
    assert parse_allowlist_entry(" 10.0.0.0/8 ") == ipaddress.ip_network("10.0.0.0/8")
    assert parse_allowlist_entry("fd00::/8") == ipaddress.ip_network("fd00::/8")


# -- plan_rule_diff (the host-access editor's preview) -----------------------------------------


def test_a_policy_change_lists_only_the_rules_that_change():
    from network.nft.plan import plan_rule_diff

    old = [
        AgentSpec.build("172.30.0.5", GW, host_access=["172.30.0.1:53", "*:4000"]),
        AgentSpec.build("172.30.0.6", GW, host_access=["*:4000"]),
    ]
    new = [
        AgentSpec.build("172.30.0.5", GW, host_access=["172.30.0.1:53", "*:9000"]),
        AgentSpec.build("172.30.0.6", GW, host_access=["*:4000"]),
        AgentSpec.build("172.30.0.7", GW, deny_all=True),
    ]
    changes = plan_rule_diff(old, new)
    assert [(str(c.address), c.action) for c in changes] == [("172.30.0.5", "change"), ("172.30.0.7", "add")]
    assert changes[0].removed == (
        "input: meta nfproto ipv4 tcp dport 4000 accept",
        "input: meta nfproto ipv4 udp dport 4000 accept",
    )
    assert changes[0].added == (
        "input: meta nfproto ipv4 tcp dport 9000 accept",
        "input: meta nfproto ipv4 udp dport 9000 accept",
    )
    assert changes[1].added[-1] == "input: drop" and "forward: drop" in changes[1].added
    gone = plan_rule_diff(new, new[:1])
    assert [(str(c.address), c.action) for c in gone] == [("172.30.0.6", "remove"), ("172.30.0.7", "remove")]


def test_reordering_entries_is_no_change_because_every_entry_accepts():
    from network.nft.plan import line_diff, plan_rule_diff, spec_rule_lines

    a = AgentSpec.build("172.30.0.5", GW, host_access=["*:4000", "172.30.0.1:53"])
    b = AgentSpec.build("172.30.0.5", GW, host_access=["172.30.0.1:53", "*:4000"])
    assert spec_rule_lines(a) != spec_rule_lines(b), "the rules are written in list order"
    assert line_diff(spec_rule_lines(a), spec_rule_lines(b)) == ([], [])
    assert plan_rule_diff([a], [b]) == [] and plan_rule_diff([a], [a]) == []


def test_a_real_change_beside_a_reorder_is_exactly_that_change():
    from network.nft.plan import line_diff, rule_changes, spec_rule_lines

    before = spec_rule_lines(AgentSpec.build("172.30.0.5", GW, host_access=["*:4000", "172.30.0.1:53", "*:8000"]))
    after = spec_rule_lines(AgentSpec.build("172.30.0.5", GW, host_access=["*:9000", "172.30.0.1:53", "*:4000"]))
    assert line_diff(before, after) == (
        ["input: meta nfproto ipv4 tcp dport 8000 accept", "input: meta nfproto ipv4 udp dport 8000 accept"],
        ["input: meta nfproto ipv4 tcp dport 9000 accept", "input: meta nfproto ipv4 udp dport 9000 accept"],
    )
    shown = rule_changes(before, after)
    assert [line for op, line in shown if op != "del"] == after, "the new rules, in their chain order"


def test_moving_an_accept_past_a_drop_is_a_change():
    from network.nft.plan import line_diff

    before = ["input: ip daddr 10.0.0.1 accept", "input: drop"]
    after = ["input: drop", "input: ip daddr 10.0.0.1 accept"]
    removed, added = line_diff(before, after)
    assert removed and added and sorted(removed) == sorted(added)


def test_the_gateway_cap_resets_a_sources_new_connection_past_the_limit():
    from network.nft.render import render_gateway_cap

    cmds = render_gateway_cap("kici", "172.30.0.1", 8000, 16)
    chain = cmds[2]["add"]["chain"]
    assert (chain["name"], chain["hook"], chain["prio"], chain["policy"]) == ("gateway", "input", -10, "accept")
    assert cmds[1]["add"]["set"]["name"] == "gateway_conns4" and cmds[3] == {
        "flush": {"chain": {"family": "inet", "table": "kici", "name": "gateway"}}
    }
    expr = cmds[4]["add"]["rule"]["expr"]
    assert expr[0]["match"]["right"] == "172.30.0.1" and expr[1]["match"]["right"] == 8000
    assert expr[3]["set"]["stmt"] == [{"ct count": {"val": 16, "inv": True}}]
    assert expr[3]["set"]["elem"] == {"payload": {"protocol": "ip", "field": "saddr"}}
    assert expr[-1] == {"reject": {"type": "tcp reset"}}
    six = render_gateway_cap("kici", "fd00::1", 8000, 4)
    assert six[1]["add"]["set"]["name"] == "gateway_conns6"


@pytest.mark.parametrize(
    "address, port, limit, fragment",
    [("gw.example", 8000, 4, "gateway address"), ("172.30.0.1", 0, 4, "gateway port"), ("172.30.0.1", 80, 0, "limit")],
)
def test_a_bad_gateway_cap_is_refused_naming_it(address, port, limit, fragment):
    from network.nft.render import render_gateway_cap
    from network.nft.spec import RuleSpecError

    with pytest.raises(RuleSpecError, match=fragment):
        render_gateway_cap("kici", address, port, limit)
