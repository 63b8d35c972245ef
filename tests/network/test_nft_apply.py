"""The nft applier against the real kernel, inside a throwaway network namespace: applying,
reaping and self-heal."""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from network.nft.apply import NftClient, NftError, NftUnavailableError, describe_agent_rules
from network.nft.describe import describe_expr
from network.nft.exprs import forward_rule_exprs, input_rule_exprs
from network.nft.spec import AgentSpec, RuleSpecError
from tests.support.network_lab import Netns
from tests.support.root import require_root

pytestmark = pytest.mark.root
GW = "172.30.0.1"


@pytest.fixture(scope="module")
def netns():
    require_root()
    ns = Netns(f"net-{secrets.token_hex(3)}-nft")
    yield ns
    ns.delete()


@pytest.fixture
def client(netns):
    c = NftClient(f"net_t{secrets.token_hex(2)}", netns=netns.name)
    yield c
    c.delete_table()


def spec(addr="172.30.0.5", **kw):
    kw.setdefault("host_access", ["172.30.0.1:53", "*:4000"])
    return AgentSpec.build(addr, GW, **kw)


def ruleset(netns, table):
    return netns.exec("nft", "list", "table", "inet", table).stdout


def described(rules):
    return [describe_expr(e) for e in rules]


def test_nft_is_available_in_the_namespace(client):
    client.check_available()


def test_a_missing_libnftables_is_reported_as_missing(netns):
    with pytest.raises(NftUnavailableError, match="not available.*libnftables1"):
        NftClient("net_x", library="/nonexistent/libnftables.so.1").check_available()


def test_a_process_without_net_admin_is_told_so(netns):
    # The same check in a child whose capability bounding set lacks CAP_NET_ADMIN (it keeps
    # CAP_SYS_ADMIN, so it still joins the namespace).
    code = (
        "from network.nft.apply import NftClient, NftUnavailableError\n"
        "try:\n"
        f"    NftClient('net_x', netns={netns.name!r}).check_available()\n"
        "except NftUnavailableError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        ["setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    ).stdout
    assert "CAP_NET_ADMIN" in out


def test_ensuring_the_table_twice_leaves_one_copy_of_the_base(client, netns):
    client.ensure_table(["br-a"])
    first = ruleset(netns, client.table)
    client.ensure_table(["br-a"])
    client.ensure_table()
    assert ruleset(netns, client.table) == first
    assert first.count("ip saddr vmap @agents4_fwd") == 1
    assert '"br-a"' in first


def test_an_agent_reads_back_exactly_as_rendered(client):
    s = spec(
        allowlist=["10.67.0.1/32", "fd99::/48"],
        host_access=["172.30.0.1:53", "*:4000", "[fd00::/64]:443", "*", "10.0.0.0/8"],
    )
    client.apply_agent(s)
    agents = client.list_agents()
    got = agents[ipaddress.ip_address("172.30.0.5")]
    assert got.complete
    assert described(got.forward) == described(forward_rule_exprs(s))
    assert described(got.input) == described(input_rule_exprs(s))


def test_applying_an_agent_twice_leaves_exactly_one_copy(client, netns):
    client.apply_agent(spec())
    once = ruleset(netns, client.table)
    client.apply_agent(spec())
    assert ruleset(netns, client.table) == once
    assert once.count("tcp dport 4000 accept") == 1


def test_self_heal_twice_leaves_exactly_one_copy(client, netns):
    specs = [spec(f"172.30.0.{i}") for i in range(2, 12)]
    client.apply_agent(specs[0])
    client.self_heal(specs, ["br-a"])
    once = ruleset(netns, client.table)
    client.self_heal(specs, ["br-a"])
    assert ruleset(netns, client.table) == once
    assert len(client.list_agents()) == 10
    # Ten agents of one policy share one input and one forward chain.
    assert once.count("ct direction reply ct state established,related accept") == 1


def test_a_thousand_agents_of_a_few_policies_are_a_few_chains(client, netns):
    specs = [spec(f"172.30.{i // 200}.{i % 200 + 2}", host_access=[f"*:{4000 + i % 3}"]) for i in range(1000)]
    client.self_heal(specs, ["br-a"])
    agents = client.list_agents()
    assert len(agents) == 1000 and all(a.complete for a in agents.values())
    chains = {a.input_chain for a in agents.values()} | {a.forward_chain for a in agents.values()}
    assert len(chains) == 4  # three input policies, one forward
    assert "tcp dport 4002 accept" in "\n".join(described(agents[ipaddress.ip_address("172.30.0.4")].input))


def test_re_applying_replaces_the_old_rules_in_one_step(client, netns):
    client.apply_agent(spec(host_access=["*:4000"]))
    client.apply_agent(spec("172.30.0.6", host_access=["*:4000"]))
    client.apply_agent(spec(host_access=["*:9000"], deny_all=True))
    got = client.list_agents()[ipaddress.ip_address("172.30.0.5")]
    text = "\n".join(described(got.input + got.forward))
    assert "9000" in text and "4000" not in text
    assert described(got.forward)[-1] == "drop"
    # The neighbour keeps the old policy's chains; once it goes, nothing jumps to them and they go too.
    other = client.list_agents()[ipaddress.ip_address("172.30.0.6")]
    assert "4000" in "\n".join(described(other.input))
    assert client.remove_agent("172.30.0.6") is True
    unused = client.snapshot()[2]  # what the drift check reads in its one listing
    assert sorted(unused) == sorted([other.input_chain, other.forward_chain])
    assert sorted(client.delete_unused_policy_chains(unused)) == sorted(unused)
    assert other.input_chain not in ruleset(netns, client.table)
    assert got.input_chain in ruleset(netns, client.table) and client.delete_unused_policy_chains() == []


def test_a_map_element_pointed_elsewhere_is_not_in_force_and_self_heal_points_it_back(client, netns):
    s = spec("172.30.0.5")
    client.apply_agent(s)
    netns.exec("nft", "add", "chain", "inet", client.table, "open")
    netns.exec("nft", "add", "rule", "inet", client.table, "open", "accept")
    netns.exec("nft", "delete", "element", "inet", client.table, "agents4_in", "{ 172.30.0.5 }")
    netns.exec("nft", "add", "element", "inet", client.table, "agents4_in", "{ 172.30.0.5 : jump open }")
    tampered = client.list_agents()[ipaddress.ip_address("172.30.0.5")]
    assert (tampered.input_chain, tampered.mapped_input, tampered.complete) == ("open", False, False)
    assert tampered.input == [] and tampered.describe()[-1] == (
        "warning: its input map element jumps to chain open, not to a policy chain; these rules are not in force"
    )
    client.self_heal([s])
    healed = client.list_agents()[ipaddress.ip_address("172.30.0.5")]
    assert healed.complete and described(healed.input) == described(input_rule_exprs(s))


def test_removing_an_agent_then_removing_it_again(client, netns):
    client.apply_agent(spec("172.30.0.5"))
    client.apply_agent(spec("172.30.0.6"))
    assert client.remove_agent("172.30.0.5") is True
    assert client.remove_agent("172.30.0.5") is False
    assert list(client.list_agents()) == [ipaddress.ip_address("172.30.0.6")]
    assert "172.30.0.5" not in ruleset(netns, client.table)


def test_removing_from_a_missing_table_is_a_no_op(client):
    assert client.list_agents() == {}
    assert client.remove_agent("172.30.0.5") is False


def test_a_half_removed_agent_is_finished_off(client, netns):
    client.apply_agent(spec("172.30.0.5"))
    chain = client.list_agents()[ipaddress.ip_address("172.30.0.5")].input_chain
    netns.exec("nft", "delete", "element", "inet", client.table, "agents4_in", "{ 172.30.0.5 }")
    netns.exec("nft", "delete", "chain", "inet", client.table, chain)
    half = client.list_agents()[ipaddress.ip_address("172.30.0.5")]
    assert (half.has_forward_chain, half.mapped_forward, half.has_input_chain, half.mapped_input) == (
        True,
        True,
        False,
        False,
    )
    assert client.remove_agent("172.30.0.5") is True
    assert client.list_agents() == {}


def test_apply_recreates_a_table_deleted_behind_its_back(client, netns):
    client.apply_agent(spec("172.30.0.5"))
    netns.exec("nft", "delete", "table", "inet", client.table)
    client.apply_agent(spec("172.30.0.6"))
    assert list(client.list_agents()) == [ipaddress.ip_address("172.30.0.6")]
    assert "ip saddr vmap @agents4_in" in ruleset(netns, client.table)


def test_reaping_deletes_only_unheld_addresses_inside_the_subnet(client):
    for addr in ("172.30.0.5", "172.30.0.9", "10.0.0.7"):
        client.apply_agent(spec(addr))
    reaped = client.reap_unowned_isolation_rules({"172.30.0.5"}, "172.30.0.0/16")
    assert reaped == ["172.30.0.9"]
    assert sorted(map(str, client.list_agents())) == ["10.0.0.7", "172.30.0.5"]


def test_a_failed_live_listing_reaps_nothing(client):
    client.apply_agent(spec("172.30.0.9"))
    assert client.reap_unowned_isolation_rules(None, "172.30.0.0/16") == []
    assert list(map(str, client.list_agents())) == ["172.30.0.9"]


def test_a_failed_rule_listing_reaps_nothing(netns):
    broken = NftClient("net_x", library="/nonexistent/libnftables.so.1", netns=netns.name)
    assert broken.reap_unowned_isolation_rules(set(), "172.30.0.0/16") == []


def test_two_consoles_with_their_own_tables_never_touch_each_other(netns):
    a = NftClient(f"net_a{secrets.token_hex(2)}", netns=netns.name)
    b = NftClient(f"net_b{secrets.token_hex(2)}", netns=netns.name)
    try:
        a.apply_agent(spec("172.30.0.5"))
        b.apply_agent(spec("172.30.0.6"))
        assert a.reap_unowned_isolation_rules(set(), "172.30.0.0/16") == ["172.30.0.5"]
        assert list(map(str, b.list_agents())) == ["172.30.0.6"]
        assert a.remove_agent("172.30.0.6") is False
        a.delete_table()
        assert list(map(str, b.list_agents())) == ["172.30.0.6"]
    finally:
        a.delete_table()
        b.delete_table()


def test_one_client_serves_several_threads_at_once(client):
    # One libnftables context per client: concurrent calls must not interleave in it (its output
    # buffer is shared), so every thread's writes land and every listing parses.
    addresses = [f"172.30.0.{10 + i}" for i in range(4)]
    errors: list[BaseException] = []

    def work(addr):
        try:
            for _ in range(15):
                client.apply_agent(spec(addr))
                assert ipaddress.ip_address(addr) in client.list_agents()
        except BaseException as exc:  # noqa: BLE001 - a thread's failure (an assert too) is reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(a,)) for a in addresses]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(map(str, client.list_agents())) == addresses


def test_a_rejected_transaction_changes_nothing(client, netns):
    client.apply_agent(spec("172.30.0.5"))
    before = ruleset(netns, client.table)
    bad = [
        {"add": {"chain": {"family": "inet", "table": client.table, "name": "a4-172-30-0-7-fwd"}}},
        {
            "add": {
                "rule": {"family": "inet", "table": client.table, "chain": "no-such-chain", "expr": [{"accept": None}]}
            }
        },
    ]
    with pytest.raises(NftError):
        client.apply_document(bad)
    assert ruleset(netns, client.table) == before


def test_the_snapshot_finds_a_missing_netdev_guard_and_an_unguarded_port(client, netns):
    """What the drift check reads: the netdev guard of each bridge and each bound port's place in
    agent_ports, besides the binding itself; self-heal puts them back."""
    netns.ip("link", "add", "br-l2", "type", "bridge", check=False)
    bound = spec("172.30.0.5", port="veth5", mac="02:4b:43:00:00:05")
    client.self_heal([bound], ["br-l2"], ["172.30.0.0/16"])
    agents, problems, _ = client.snapshot(["br-l2"])
    assert problems == []
    assert agents[bound.address].bindings == [("veth5", "02:4b:43:00:00:05")]
    assert agents[bound.address].unguarded_ports == []
    guard_line = "guard: untagged frames from port veth5, MAC 02:4b:43:00:00:05, source 172.30.0.5 pass"
    assert guard_line in describe_agent_rules(client, "172.30.0.5")
    netns.exec("nft", "delete", "element", "bridge", client.table, "agent_ports", "{ veth5 }")
    netns.exec("nft", "flush", "chain", "netdev", client.table, "guard-br-l2")
    agents, problems, _ = client.snapshot(["br-l2"])
    assert problems == ["netdev chain guard-br-l2: 0 rules, expected 1"]
    assert agents[bound.address].unguarded_ports == ["veth5"]
    netns.exec("nft", "delete", "table", "netdev", client.table)
    assert client.snapshot(["br-l2"])[1] == [f"table netdev {client.table} is missing"]
    client.self_heal([bound], ["br-l2"], ["172.30.0.0/16"])
    agents, problems, _ = client.snapshot(["br-l2"])
    assert problems == [] and agents[bound.address].unguarded_ports == []
    assert client.remove_agent("172.30.0.5")
    assert "veth5" not in netns.exec("nft", "list", "set", "bridge", client.table, "agent_ports").stdout


def test_the_rules_in_force_are_described_in_words(client):
    client.apply_agent(spec("172.30.0.5", host_access=["172.30.0.1:53"]))
    lines = describe_agent_rules(client, "172.30.0.5")
    assert lines[0] == "forward: ip daddr 172.30.0.1 accept"
    assert "input: ip daddr 172.30.0.1 udp dport 53 accept" in lines
    assert lines[-1] == "input: drop"
    assert describe_agent_rules(client, "172.30.0.77") == ["no isolation rules in force for 172.30.0.77"]


def test_the_json_listing_is_what_ownership_is_read_from(client, netns):
    client.apply_agent(spec("172.30.0.5"))
    # A hand-written chain, even with a policy chain's name, makes no agent: only elements do.
    netns.exec("nft", "add", "chain", "inet", client.table, "pol-in-0123456789abcdef")
    netns.exec("nft", "add", "rule", "inet", client.table, "pol-in-0123456789abcdef", "ip saddr 172.30.0.5 drop")
    assert list(map(str, client.list_agents())) == ["172.30.0.5"]
    listing = json.loads(netns.exec("nft", "-j", "list", "table", "inet", client.table).stdout)
    assert any(item.get("chain", {}).get("name") == "pol-in-0123456789abcdef" for item in listing["nftables"])


def test_the_egress_baseline_is_accepted_and_idempotent(client, netns):
    client.apply_agent(spec("10.0.0.2"))
    client.ensure_egress("10.0.0.0/24", "eth9")
    once = ruleset(netns, client.table)
    client.ensure_egress("10.0.0.0/24", "eth9")
    client.ensure_table(["kici-br0"])
    again = ruleset(netns, client.table)
    assert again.count('ip saddr 10.0.0.0/24 oifname "eth9" masquerade') == 1
    assert again.count("tcp option maxseg size set 1460") == 1
    assert once.count("masquerade") == 1
    assert list(map(str, client.list_agents())) == ["10.0.0.2"]
    with pytest.raises(RuleSpecError):
        client.ensure_egress("10.0.0.1/24", "eth9")


def test_the_sessions_clean_up_drops_every_family_of_its_table():
    """What the test session drops when it ends (tests/conftest.py): the console's inet table and
    its bridge and netdev twins of the same name, so no table of the run outlives it."""
    from tests.support.nft import drop_tables

    require_root()
    name = f"kicidrop{secrets.token_hex(2)}"
    for family in ("inet", "bridge", "netdev"):
        subprocess.run(["nft", "add", "table", family, name], check=True)
    drop_tables(name)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    assert name not in tables, tables
