"""Host provisioning and settings of Firecracker scalers (``provision.ensure_host_ready``,
``provision.reapply_isolation_for_tracked_vms``, ``FirecrackerSettings``)."""

from __future__ import annotations

import json
import subprocess

import pytest

from network.nft.render import EGRESS_MSS_CHAIN as MSS_CHAIN
from network.nft.render import EGRESS_NAT_CHAIN as NAT_CHAIN
from scalers.backends.firecracker.settings import FirecrackerSettings
from tests.support.firecracker import FAKE_JAILER, fake_kernel

ENTRY = {"name": "fc1", "maxAgents": 3, "firecrackerPath": "/usr/bin/firecracker", "jailerPath": "/usr/bin/jailer",
         "kernelPath": "/var/lib/kici/vmlinux", "uid": 1000, "gid": 1000}  # fmt: skip


def test_settings_take_the_documented_defaults():
    s = FirecrackerSettings.from_config(ENTRY, {})
    assert (s.chroot_base_dir, s.vcpu_count, s.mem_size_mib, s.require_sudo) == ("/srv/jailer", 2, 512, False)
    assert (s.cidr, s.bridge_name, s.gateway, s.netmask, s.table, s.auto_provision_host) == (
        "10.0.0.0/24", "kici-br0", "10.0.0.1", "255.255.255.0", "kici", True,
    )  # fmt: skip
    assert s.prefix == 24 and s.socket_wait_s == 5.0 and s.destroy_wait_s == 5.0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"jailerPath": None}, "Firecracker scaler \"fc1\" requires a 'jailerPath' field"),
        ({"uid": None}, "requires a 'uid' field"),
        ({"gid": "1000"}, "'gid' must be a non-negative integer, got '1000'"),
        ({"vcpuCount": 0}, "'vcpuCount' must be a positive integer, got 0"),
    ],
)
def test_settings_name_the_bad_field(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FirecrackerSettings.from_config({**ENTRY, **change}, {})


def test_settings_refuse_a_gateway_outside_the_subnet():
    with pytest.raises(ValueError, match="firecracker.gateway 10.1.0.1 is outside firecracker.cidr 10.0.0.0/24"):
        FirecrackerSettings.from_config(ENTRY, {"gateway": "10.1.0.1"})


def _nft_list(env):
    out = subprocess.run(["ip", "netns", "exec", env.netns, "nft", "-j", "list", "table", "inet", env.table],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return json.loads(out)["nftables"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_provisioning_builds_bridge_table_baseline_and_reapplies_tracked_vms_rules(fc_env):
    env = fc_env
    # An uplink with a default route inside the namespace (a TAP: nothing can leave through it).
    for cmd in (
        ["ip", "tuntap", "add", "up0", "mode", "tap"],
        ["ip", "addr", "add", "192.0.2.2/24", "dev", "up0"],
        ["ip", "link", "set", "up0", "up"],
        ["ip", "route", "add", "default", "via", "192.0.2.1", "dev", "up0", "onlink"],
    ):
        subprocess.run(["ip", "netns", "exec", env.netns, *cmd], check=True)
    b = env.backend(jailer=FAKE_JAILER, firecracker="/opt/fake/firecracker", kernel=env.write_image("k", fake_kernel()))
    assert b.ensure_host_ready() is True
    addr = env.ip("-j", "addr", "show", "dev", env.bridge).stdout
    assert f'"local":"{env.gateway}","prefixlen":24' in addr.replace(" ", "")
    assert "kici-isoprobe" not in env.links()
    items = _nft_list(env)
    chains = {i["chain"]["name"] for i in items if "chain" in i}
    assert {NAT_CHAIN, MSS_CHAIN, "forward", "input"} <= chains
    nat = [i["rule"] for i in items if "rule" in i and i["rule"]["chain"] == NAT_CHAIN]
    assert len(nat) == 1 and nat[0]["expr"][1]["match"]["right"] == "up0"
    assert f"guard-{env.bridge}" in chains  # the bridge's ingress guard (policy drop)
    guard = [i["chain"] for i in items if "chain" in i and i["chain"]["name"] == f"guard-{env.bridge}"][0]
    assert (guard["hook"], guard["policy"]) == ("ingress", "drop")

    spec = {"labels": ["x"], "rootfsPath": str(env.rootfs()), "overlayDriveSizeMib": 8}
    vm = b.spawn("scaler-firecracker-0000e0e0", spec, None, "ws://10.213.0.1:4000/ws")
    b.nft.remove_agent(vm.ip)  # a self-heal swept it
    assert vm.ip not in {str(a) for a in b.nft.list_agents()}
    assert b.ensure_host_ready() is True
    assert b.ensure_host_ready() is True  # twice: no duplicates
    agents = b.nft.list_agents()
    restored = [r for a, r in agents.items() if str(a) == vm.ip]
    assert restored and restored[0].complete
    assert restored[0].ports == [vm.tap], "the VM's TAP was not bound again with its rules"
    assert len(restored[0].input) == 1 + 2 * 2 + 1  # ct accept, gateway:53 and *:4000 (tcp+udp), drop
    nat_after = [i for i in _nft_list(env) if "rule" in i and i["rule"]["chain"] == NAT_CHAIN]
    assert len(nat_after) == 1
    assert b.destroy(vm.agent_id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.root
def test_without_auto_provisioning_nothing_is_touched(fc_env):
    env = fc_env
    b = env.backend(
        jailer=FAKE_JAILER, firecracker="/opt/fc/firecracker", kernel="/bin/false", auto_provision_host=False
    )
    assert b.ensure_host_ready() is False
    assert env.bridge not in env.links()
