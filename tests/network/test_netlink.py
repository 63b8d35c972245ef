"""Bridge and TAP plumbing over netlink, in a throwaway namespace."""

from __future__ import annotations

import secrets

import pytest

from network import netlink
from network.netlink import BridgePortIsolationUnavailable, NetlinkError, tap_name_for
from tests.support.network_lab import Netns
from tests.support.root import require_root

# -- names (pure) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "agent_id, name",
    [
        ("abcdef1234567890", "kici-34567890"),
        ("abc", "kici-abc"),
        ("scaler-firecracker-1d993749", "kici-1d993749"),
        ("vm-001", "kici-vm-001"),
    ],
)
def test_tap_names_are_kici_and_the_last_eight_characters(agent_id, name):
    assert tap_name_for(agent_id) == name
    assert len(tap_name_for(agent_id).encode()) <= 15


def test_an_id_with_characters_an_interface_name_cannot_hold_gets_the_hashed_name():
    for agent_id in ("vm/with:odd chars", "héllo-wörld-ünï", "x" * 7 + ".."[:1] + "/"):
        name = tap_name_for(agent_id)
        assert name.startswith("kici-x") and len(name) == 15
        assert netlink.validate_ifname(name) == name
        assert tap_name_for(agent_id) == name  # deterministic


def test_a_name_held_by_another_agent_falls_back_to_the_hashed_name():
    owners = {"kici-1d993749": "scaler-firecracker-1d993749"}
    other = tap_name_for("scaler-b-1d993749", owners)
    assert other != "kici-1d993749" and other.startswith("kici-x") and len(other) == 15
    assert tap_name_for("scaler-firecracker-1d993749", owners) == "kici-1d993749"  # its own name


def test_the_hashed_names_of_many_ids_sharing_a_suffix_do_not_collide():
    owners = {"kici-00000000": "owner"}
    names = {tap_name_for(f"scaler-{i}-00000000", owners) for i in range(20000)}
    assert len(names) == 20000


def test_an_empty_id_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        tap_name_for("")


@pytest.mark.parametrize("name", ["", "a" * 16, "a/b", "a:b", "a b", ".", "é" * 8])
def test_bad_interface_names_are_refused(name):
    with pytest.raises(ValueError, match="interface name"):
        netlink.validate_ifname(name)


# -- the kernel --------------------------------------------------------------------------------


@pytest.fixture
def ns():
    require_root()
    ns = Netns(f"net-{secrets.token_hex(3)}-nl")
    yield ns
    ns.delete()


def link_detail(ns, name):
    return ns.ip("-d", "link", "show", name).stdout


@pytest.mark.root
def test_a_bridge_is_created_once_with_its_address(ns):
    first = netlink.ensure_bridge("kici-br9", "10.213.7.1/24", netns=ns.name)
    assert netlink.ensure_bridge("kici-br9", "10.213.7.1/24", netns=ns.name) == first
    addrs = ns.ip("-4", "-o", "addr", "show", "dev", "kici-br9").stdout
    assert addrs.count("10.213.7.1/24") == 1
    assert "bridge" in link_detail(ns, "kici-br9")
    assert "kici-br9" not in netlink.link_names()  # nothing leaked into this namespace


@pytest.mark.root
def test_a_name_taken_by_something_else_is_not_mistaken_for_a_bridge(ns):
    ns.ip("link", "add", "notabr", "type", "veth", "peer", "name", "notabr-p")
    with pytest.raises(NetlinkError, match="not a bridge"):
        netlink.ensure_bridge("notabr", netns=ns.name)


@pytest.mark.root
def test_a_tap_is_created_enslaved_isolated_and_up(ns):
    netlink.ensure_bridge("kici-br9", netns=ns.name)
    netlink.create_tap("kici-1d993749", "kici-br9", netns=ns.name)
    detail = link_detail(ns, "kici-1d993749")
    assert "tun type tap pi off" in detail
    assert "master kici-br9" in detail
    assert "isolated on" in detail
    assert ",UP" in detail.splitlines()[0]
    assert netlink.port_isolated("kici-1d993749", netns=ns.name)
    assert netlink.delete_link("kici-1d993749", netns=ns.name) is True
    assert netlink.delete_link("kici-1d993749", netns=ns.name) is False


@pytest.mark.root
def test_a_tap_that_cannot_be_enslaved_is_not_left_behind(ns):
    ns.ip("link", "add", "notabr", "type", "veth", "peer", "name", "notabr-p")
    with pytest.raises(NetlinkError):
        netlink.create_tap("kici-aaaa0000", "notabr", netns=ns.name)
    assert "kici-aaaa0000" not in netlink.link_names(netns=ns.name)


@pytest.mark.root
def test_the_isolation_probe_passes_on_a_bridge_and_cleans_up(ns):
    netlink.ensure_bridge("kici-br9", netns=ns.name)
    assert netlink.assert_bridge_port_isolation_supported("kici-br9", netns=ns.name) is True
    assert netlink.PROBE_TAP not in netlink.link_names(netns=ns.name)


@pytest.mark.root
def test_the_isolation_probe_fails_closed_when_the_port_cannot_be_isolated(ns):
    ns.ip("link", "add", "kici-br9", "type", "veth", "peer", "name", "kici-br9p")  # not a bridge
    with pytest.raises(BridgePortIsolationUnavailable, match="bridge port isolation is not available on kici-br9"):
        netlink.assert_bridge_port_isolation_supported("kici-br9", netns=ns.name)
    assert netlink.PROBE_TAP not in netlink.link_names(netns=ns.name)


@pytest.mark.root
def test_the_isolation_probe_fails_closed_when_the_bridge_is_missing(ns):
    with pytest.raises(BridgePortIsolationUnavailable, match="does not exist"):
        netlink.assert_bridge_port_isolation_supported("kici-br9", netns=ns.name)


@pytest.mark.root
def test_the_isolation_probe_is_skipped_when_no_tap_can_be_created(ns, caplog):
    netlink.ensure_bridge("kici-br9", netns=ns.name)
    assert (
        netlink.assert_bridge_port_isolation_supported("kici-br9", probe="kici-probe-too-long", netns=ns.name) is False
    )
    assert "probe skipped" in caplog.text


@pytest.mark.root
def test_a_leftover_probe_tap_is_replaced(ns):
    netlink.ensure_bridge("kici-br9", netns=ns.name)
    ns.ip("tuntap", "add", netlink.PROBE_TAP, "mode", "tap")
    assert netlink.assert_bridge_port_isolation_supported("kici-br9", netns=ns.name) is True
    assert netlink.PROBE_TAP not in netlink.link_names(netns=ns.name)


@pytest.mark.root
def test_a_missing_namespace_is_a_clear_error():
    require_root()
    with pytest.raises(NetlinkError, match="net-does-not-exist cannot be opened"):
        netlink.link_names(netns="net-does-not-exist")


@pytest.mark.root
def test_the_bridge_is_taught_a_reused_address_at_its_new_holders_mac(ns):
    netlink.ensure_bridge("kici-br9", "10.213.7.1/24", netns=ns.name)
    ns.ip("link", "set", "kici-br9", "up")
    ns.ip("neigh", "add", "10.213.7.2", "lladdr", "02:00:00:00:00:0a", "dev", "kici-br9", "nud", "reachable")
    netlink.teach_bridge("10.213.7.2", "02:00:00:00:00:0b", "kici-br9", netns=ns.name)
    shown = ns.ip("neigh", "show", "10.213.7.2", "dev", "kici-br9").stdout
    assert "02:00:00:00:00:0b" in shown and "02:00:00:00:00:0a" not in shown, shown
    with pytest.raises(NetlinkError, match="kici-br8 not found"):
        netlink.teach_bridge("10.213.7.2", "02:00:00:00:00:0b", "kici-br8", netns=ns.name)
