"""dockerd's FORWARD policy DROP and the VMs' egress: the DOCKER-USER accepts for the bridge, with
real packets through a namespace whose iptables (nf_tables) filter table is made the way dockerd
makes it."""

from __future__ import annotations

import os
import subprocess

import pytest

from scalers.backends.firecracker.provision import DOCKER_USER, ensure_docker_user_accepts
from tests.support.firecracker import FAKE_JAILER
from tests.support.network_lab import Listener, Netns, tcp_reachable
from tests.support.root import require_root

pytestmark = pytest.mark.root
PORT = 8443


def docker_filter_table(ns: str) -> None:
    """What dockerd's iptables set-up leaves in the filter table: FORWARD policy DROP, jumping
    first to an empty DOCKER-USER chain that returns."""
    for args in (["-P", "FORWARD", "DROP"], ["-N", DOCKER_USER], ["-A", DOCKER_USER, "-j", "RETURN"],
                 ["-I", "FORWARD", "-j", DOCKER_USER]):  # fmt: skip
        subprocess.run(["ip", "netns", "exec", ns, "iptables", *args], check=True)


def docker_user_chain(ns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-S", DOCKER_USER], capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else []


@pytest.fixture
def routed():
    """``host`` routes between a bridge (a VM behind it in ``vm``) and an uplink to ``out``, which
    serves TCP on PORT."""
    require_root()
    tag = f"{os.getpid() % 10000}"
    octet = 10 + os.getpid() % 200
    nets = {k: Netns(f"kdu-{tag}-{k}") for k in ("host", "vm", "out")}
    try:
        host, vm, out = nets["host"], nets["vm"], nets["out"]
        host.ip("link", "add", "kdu-br0", "type", "bridge")
        host.ip("addr", "add", f"10.244.{octet}.1/24", "dev", "kdu-br0")
        host.ip("link", "set", "kdu-br0", "up")
        host.ip("link", "add", "kdu-vm", "type", "veth", "peer", "name", "eth0", "netns", vm.name)
        host.ip("link", "set", "kdu-vm", "master", "kdu-br0", "up")
        vm.ip("addr", "add", f"10.244.{octet}.2/24", "dev", "eth0")
        vm.ip("link", "set", "eth0", "up")
        vm.ip("route", "add", "default", "via", f"10.244.{octet}.1")
        host.ip("link", "add", "kdu-up", "type", "veth", "peer", "name", "eth0", "netns", out.name)
        host.ip("addr", "add", f"10.245.{octet}.1/24", "dev", "kdu-up")
        host.ip("link", "set", "kdu-up", "up")
        out.ip("addr", "add", f"10.245.{octet}.2/24", "dev", "eth0")
        out.ip("link", "set", "eth0", "up")
        out.ip("route", "add", f"10.244.{octet}.0/24", "via", f"10.245.{octet}.1")
        host.sysctl("net.ipv4.ip_forward", "1")
        listener = Listener(out, PORT)
        yield nets, f"10.245.{octet}.2"
        listener.close()
    finally:
        for ns in nets.values():
            ns.delete()


def test_the_docker_user_accepts_let_the_vms_out_through_dockerd_forward_drop_once(routed):
    nets, server = routed
    host, vm = nets["host"], nets["vm"]
    assert tcp_reachable(vm, server, PORT)  # routed, before dockerd
    docker_filter_table(host.name)
    assert not tcp_reachable(vm, server, PORT)  # dockerd's FORWARD policy drops the VM's egress
    assert ensure_docker_user_accepts("kdu-br0", netns=host.name)
    assert tcp_reachable(vm, server, PORT)
    chain = docker_user_chain(host.name)
    assert chain == [
        f"-N {DOCKER_USER}",
        f"-A {DOCKER_USER} -i kdu-br0 -j ACCEPT",
        f"-A {DOCKER_USER} -o kdu-br0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A {DOCKER_USER} -j RETURN",
    ]
    assert ensure_docker_user_accepts("kdu-br0", netns=host.name)
    assert docker_user_chain(host.name) == chain  # idempotent


def test_without_dockerd_nothing_is_added(routed):
    nets, _server = routed
    assert not ensure_docker_user_accepts("kdu-br0", netns=nets["host"].name)
    assert docker_user_chain(nets["host"].name) == []


@pytest.mark.django_db(transaction=True)
def test_host_provisioning_adds_the_accepts_where_dockerd_runs(fc_env):
    env = fc_env
    docker_filter_table(env.netns)
    b = env.backend(jailer=FAKE_JAILER, firecracker="/usr/bin/firecracker", kernel=env.write_image("k", b"k"))
    assert b.ensure_host_ready()
    assert f"-A {DOCKER_USER} -i {env.bridge} -j ACCEPT" in docker_user_chain(env.netns)
