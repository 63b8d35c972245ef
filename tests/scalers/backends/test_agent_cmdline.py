"""No agent token on any command line: /proc/<pid>/cmdline is readable by every local user, and a
session token read there lets anyone heartbeat as the agent (or, for the MMDS session token, read
the agent's registration token).

The shipped agents run in a network namespace of their own (the guest's view: MMDS and the
console on its loopback), against a console and an MMDS that answer slowly, so every HTTP client
process they start lives long enough to be seen; meanwhile every process on the machine has its
command line read, over and over.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from scalers.backends.firecracker import jail
from tests.support.guest import BUSYBOX, Console, Mmds, busybox_path, environ_for_guest
from tests.support.network_lab import Netns, in_netns
from tests.support.root import require_root

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "sandbox_agent"
CONSOLE_PORT = 8000
#: Seconds each console and MMDS answer waits: the clients' processes stay alive that long.
SLOW = 0.4


def slow(handler_class):
    """``handler_class`` answering every request after :data:`SLOW` seconds."""

    class Slow(handler_class):
        def do_GET(self):
            time.sleep(SLOW)
            super().do_GET()

        def do_POST(self):
            time.sleep(SLOW)
            super().do_POST()

        def do_PUT(self):
            time.sleep(SLOW)
            super().do_PUT()

    return Slow


def serve(ns: Netns, port: int, handler) -> ThreadingHTTPServer:
    server = in_netns(ns.name, lambda: ThreadingHTTPServer(("127.0.0.1", port), handler))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def command_lines() -> dict[int, bytes]:
    """Every process's command line, as any local user reads it."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
    return found


def watch(proc: subprocess.Popen, before: set[int], secrets_: callable) -> tuple[set[bytes], set[bytes]]:
    """Read every command line until ``proc`` ends: (lines holding a secret, all lines seen of
    processes not in ``before``, the pids that ran before ``proc`` started)."""
    leaked: set[bytes] = set()
    seen: set[bytes] = set()
    while proc.poll() is None:
        for pid, line in command_lines().items():
            if pid in before:
                continue
            seen.add(line)
            if any(s and s.encode() in line for s in secrets_()):
                leaked.add(line)
        time.sleep(0.005)
    return leaked, seen


@pytest.fixture
def guest_ns():
    require_root()
    ns = Netns(f"net-{secrets.token_hex(3)}-cmdline")
    try:
        yield ns
    finally:
        ns.delete()


@pytest.mark.parametrize("agent", ["guest_mmds.sh + kici_agent.sh", "kici_agent.py"])
def test_no_agent_token_is_ever_on_a_command_line(guest_ns, tmp_path, agent):
    console = Console(f"scaler-firecracker-{secrets.token_hex(4)}", f"ket_{secrets.token_hex(16)}")
    mmds = Mmds(version="V2")
    url = f"http://127.0.0.1:{CONSOLE_PORT}"
    mmds.data = jail.build_mmds_payload(
        orchestrator_url=url, agent_id=console.agent_id, labels=["linux"], gateway="127.0.0.1", token=console.token
    )
    servers = [serve(guest_ns, CONSOLE_PORT, slow(console.handler()))]
    if agent == "kici_agent.py":
        argv = [sys.executable, str(AGENT / "kici_agent.py")]
        env = environ_for_guest(
            "/usr/bin:/bin", KICI_ORCHESTRATOR_URL=url, KICI_AGENT_ID=console.agent_id, KICI_AGENT_TOKEN=console.token
        )
    else:
        servers.append(serve(guest_ns, 80, slow(mmds.handler())))
        argv = [BUSYBOX, "sh", str(AGENT / "guest_mmds.sh")]
        env = environ_for_guest(
            busybox_path(tmp_path),
            KICI_MMDS_ADDRESS="127.0.0.1",
            KICI_AGENT_SCRIPT=str(AGENT / "kici_agent.sh"),
            KICI_MMDS_WAIT_SECONDS="20",
        )
    try:
        before = set(command_lines())
        proc = subprocess.Popen(
            [shutil.which("ip"), "netns", "exec", guest_ns.name, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        leaked, seen = watch(proc, before, lambda: [console.token, console.session, *mmds.tokens])
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert proc.returncode == 0, out
    paths = [r[0] for r in console.requests]
    assert paths[:2] == ["/api/v1/agents/register", f"/api/v1/agents/{console.agent_id}/heartbeat"], out
    assert console.requests[1][1] == f"Bearer {console.session}", "the agent authenticated its heartbeat"
    program = agent.split()[0].encode()  # the watch saw the agent's own process, so it was not blind
    assert any(program in line for line in seen), sorted(seen)
    assert not leaked, f"a token on a command line: {sorted(leaked)}"
