"""Benchmark: isolation rules for 1,000 agents, the cost of adding/removing one, and TCP connects
per second through the forward hook with them loaded.

Runs inside throwaway network namespaces (created and deleted here), as root:

    .venv/bin/python bench/nft.py [--agents 1000] [--repeat 7] [--connect-seconds 3]

Prints seconds for: rendering 1,000 agents (pure Python), applying them in ONE transaction
(render included, best of 3) when they have ``--policies`` distinct host-access lists (label sets
sharing policy chains) and when every one has its own (the worst case), adding one / removing one
agent at 10 and at 1,000 agents (median of ``--repeat``), and TCP connects per second from an agent
through the router namespace's forward hook with no table against 1,000 agents loaded (best of
short rounds, the two alternating). Every agent owns a bridge port. Targets: < 0.3 s for 1,000 of
``--policies`` policies; add and remove one < 10 ms at 1,000; connects with 1,000 agents >= 85 %
of those with none.

Topology (every address lives on the bench's own veths and bridge, in its own namespaces, which
have no uplink: nothing can leave the machine)::

    client ns  eth0 172.30.1.2/16 ──veth── kb-c0 ┐ kici-br0 172.30.0.1/16    router ns
                                                   kb-s0 10.67.0.254/24 ──veth── server ns eth0 10.67.0.1/24
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from network.netlink import run_in_netns
from network.nft.apply import NftClient
from network.nft.render import render_full
from network.nft.spec import AgentSpec

GW = "172.30.0.1"
HOST_ACCESS = ["172.30.0.1:53", "*:4000", "192.168.1.5:9000"]
SERVER = "10.67.0.1"  # in every agent's allowlist
SERVER_PORT = 8080
CLIENT_PORT = "kb-c0"  # the bridge port of agent 0, the client
MAX_CONNECTS = 200_000


def address(i: int) -> str:
    return f"172.30.{(i // 250) + 1}.{(i % 250) + 2}"


def spec(i: int, policies: int = 1) -> AgentSpec:
    """Agent ``i`` of a fleet with ``policies`` distinct host-access lists (label sets); each agent
    owns a bridge port, as containers and VMs do (only the client's exists: a port-set element
    names an interface without needing it)."""
    port = CLIENT_PORT if i == 0 else f"kb-{i}"
    host_access = HOST_ACCESS + [f"*:{5000 + i % policies}"]
    return AgentSpec.build(address(i), GW, allowlist=[f"{SERVER}/32"], host_access=host_access, port=port, mac=mac(i))


def mac(i: int) -> str:
    """Agent ``i``'s MAC (the client's eth0 gets agent 0's)."""
    return "02:4b:43:" + ":".join(f"{(i >> s) & 0xFF:02x}" for s in (16, 8, 0))


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def build_topology(router: str, client: str, server: str) -> None:
    """Namespaces and links of the module docstring's picture (the router ns exists already)."""
    for ns in (client, server):
        sh("ip", "netns", "add", ns)
    sh("ip", "-n", router, "link", "set", "kici-br0", "up")
    sh("ip", "-n", router, "addr", "add", f"{GW}/16", "dev", "kici-br0")
    sh("ip", "-n", router, "link", "add", CLIENT_PORT, "type", "veth", "peer", "name", "eth0", "address", mac(0),
       "netns", client)  # fmt: skip
    sh("ip", "-n", router, "link", "set", CLIENT_PORT, "master", "kici-br0", "up")
    sh("ip", "-n", router, "link", "add", "kb-s0", "type", "veth", "peer", "name", "eth0", "netns", server)
    sh("ip", "-n", router, "addr", "add", "10.67.0.254/24", "dev", "kb-s0")
    sh("ip", "-n", router, "link", "set", "kb-s0", "up")
    for ns, addr, via in ((client, f"{address(0)}/16", GW), (server, f"{SERVER}/24", "10.67.0.254")):
        sh("ip", "-n", ns, "addr", "add", addr, "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", via)
    sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def serve(server: str, stop: threading.Event, ready: threading.Event) -> None:
    """Accept and close connections on SERVER:SERVER_PORT in the server ns until ``stop``."""

    def loop() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as lsock:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((SERVER, SERVER_PORT))
            lsock.listen(1024)
            lsock.settimeout(0.2)
            ready.set()
            while not stop.is_set():
                try:
                    conn, _ = lsock.accept()
                except TimeoutError:
                    continue
                conn.close()

    run_in_netns(server, loop)


def connects_per_second(client: str, seconds: float) -> float:
    """TCP connects per second from the client ns to the server: the best of rounds of 0.25 s
    over ``seconds`` (at most MAX_CONNECTS in all); the best, because other load on the machine
    only ever slows a round down. Each connection is reset on close so no TIME_WAIT piles up.
    Raises OSError when a connect fails (the rules dropped it)."""

    def loop() -> float:
        best, done = 0.0, 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and done < MAX_CONNECTS:
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.25:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    sock.settimeout(2.0)
                    sock.connect((SERVER, SERVER_PORT))
                count += 1
            done += count
            best = max(best, count / (time.perf_counter() - start))
        return best

    return run_in_netns(client, loop)


def connect_ratio(client: NftClient, client_ns: str, specs: list[AgentSpec], seconds: float) -> tuple[float, float]:
    """(connects/s with no table, with ``specs`` loaded): phases alternate three times, each
    condition's best taken, so a burst of other load hits both alike. Leaves the specs loaded."""
    none, loaded = 0.0, 0.0
    for _ in range(3):
        client.delete_table()
        none = max(none, connects_per_second(client_ns, seconds / 3))
        client.self_heal(specs, ["kici-br0"], ["172.30.0.0/16"])
        loaded = max(loaded, connects_per_second(client_ns, seconds / 3))
    return none, loaded


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def full_apply(client: NftClient, population: int, policies: int) -> float:
    """Render + apply ``population`` agents of ``policies`` policies onto an empty namespace: best of 3, s."""
    specs = [spec(i, policies) for i in range(population)]
    fulls = []
    for _ in range(3):
        client.delete_table()
        fulls.append(timed(lambda: client.self_heal(specs, ["kici-br0"], ["172.30.0.0/16"])))
    return min(fulls)


def add_remove_costs(client: NftClient, population: int, repeat: int, policies: int) -> tuple[float, float, float]:
    """(render+apply full population s, best of 3 onto an empty namespace; median add-one s,
    median remove-one s), the fleet having ``policies`` policies."""
    specs = [spec(i, policies) for i in range(population)]
    fulls = []
    for _ in range(3):
        client.delete_table()
        fulls.append(timed(lambda: client.self_heal(specs, ["kici-br0"], ["172.30.0.0/16"])))
    full = min(fulls)
    adds, removes = [], []
    for n in range(repeat):
        extra = spec(50_000 + n, policies)
        adds.append(timed(lambda extra=extra: client.apply_agent(extra)))
        removes.append(timed(lambda extra=extra: client.remove_agent(extra.address)))
    agents = client.list_agents()
    assert len(agents) == population and all(a.complete for a in agents.values()), "read-back mismatch"
    return full, statistics.median(adds), statistics.median(removes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--policies", type=int, default=20, help="distinct host-access lists in the fleet")
    parser.add_argument("--connect-seconds", type=float, default=3.0, help="per condition, in all")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/nft.py needs root (network namespace + nft)", file=sys.stderr)
        return 2

    tag = secrets.token_hex(3)
    ns, client_ns, server_ns = f"net-bench-{tag}", f"net-bench-{tag}-c", f"net-bench-{tag}-s"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    # The guard chain hooks the bridge's ingress, so the bridge must exist.
    subprocess.run(["ip", "-n", ns, "link", "add", "kici-br0", "type", "bridge"], check=True)
    stop, ready = threading.Event(), threading.Event()
    server = threading.Thread(target=serve, args=(server_ns, stop, ready), daemon=True)
    try:
        build_topology(ns, client_ns, server_ns)
        server.start()
        if not ready.wait(10):
            raise RuntimeError("the bench server did not start")
        client = NftClient(f"net_bench_{secrets.token_hex(2)}", netns=ns)
        floor = statistics.median(timed(lambda: client._run("list tables")) for _ in range(args.repeat))

        specs = [spec(i, args.policies) for i in range(args.agents)]
        render_s = timed(lambda: render_full(client.table, specs, ["kici-br0"], ["172.30.0.0/16"]))
        big_full, big_add, big_remove = add_remove_costs(client, args.agents, args.repeat, args.policies)
        rules = sum(1 for item in client.list_table() or [] if "rule" in item)
        cps_none, cps_loaded = connect_ratio(client, client_ns, specs, args.connect_seconds)
        small_full, small_add, small_remove = add_remove_costs(client, 10, args.repeat, args.policies)
        distinct_full = full_apply(client, args.agents, args.agents)
        client.delete_table()

        print(f"libnftables floor (list tables, empty):              {floor:.4f} s")
        print(f"render {args.agents} agents (pure Python):               {render_s:.4f} s")
        print(
            f"apply {args.agents} agents of {args.policies} policies, one transaction (+render): {big_full:.4f} s  "
            f"({rules} inet rules)"
        )
        print(f"apply {args.agents} agents of {args.agents} distinct policies (worst case): {distinct_full:.4f} s")
        print(f"apply 10 agents, one transaction (+render):          {small_full:.4f} s")
        print(f"add one agent    @10: {small_add:.4f} s   @{args.agents}: {big_add:.4f} s   (median of {args.repeat})")
        print(
            f"remove one agent @10: {small_remove:.4f} s   @{args.agents}: {big_remove:.4f} s   (median of "
            f"{args.repeat})"
        )
        ratio = cps_loaded / cps_none
        print(
            f"TCP connects/s through the forward hook: no table {cps_none:.0f}, {args.agents} agents "
            f"{cps_loaded:.0f} ({ratio:.0%})"
        )
        targets = {
            f"apply {args.agents} of {args.policies} policies < 0.3 s": big_full < 0.3,
            f"add one @{args.agents} < 10 ms": big_add < 0.010,
            f"remove one @{args.agents} < 10 ms": big_remove < 0.010,
            "connects >= 85 %": ratio >= 0.85,
        }
        print("targets: " + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in targets.items()))
        return 0 if all(targets.values()) else 1
    finally:
        stop.set()
        if server.is_alive():
            server.join(5)
        for name in (client_ns, server_ns, ns):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


if __name__ == "__main__":
    raise SystemExit(main())
