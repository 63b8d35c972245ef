"""The shipped agents outlive a console restart: they give up on a console only after
``KICI_CONSOLE_PATIENCE_SECONDS`` without an answered heartbeat, however many beats that is, so a
restart slower than a dozen beats does not end every agent. A console on loopback that drops its
connections while "down" stands in for one that is stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.guest import BUSYBOX, busybox_path, environ_for_guest

AGENT = Path(__file__).resolve().parents[3] / "sandbox_agent"
#: Seconds between heartbeats, as the console's register answer says.
INTERVAL = 0.2


class DownConsole:
    """Register answers a session at once; heartbeats find the console down (connection dropped
    unanswered) until :meth:`come_back`, then the next one answers ``{"stop": true}``."""

    def __init__(self):
        self.down = True
        self.beats = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def come_back(self):
        self.down = False

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        console = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/api/v1/agents/register":
                    answer = {"sessionToken": "session", "heartbeatIntervalSeconds": INTERVAL}
                else:
                    console.beats += 1
                    if console.down:
                        self.close_connection = True
                        return  # no answer: the client sees the connection dropped
                    answer = {"stop": True}
                raw = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        return Handler


def _start(kind: str, console: DownConsole, tmp_path: Path, patience: str) -> subprocess.Popen:
    env = {
        "KICI_ORCHESTRATOR_URL": console.url,
        "KICI_AGENT_ID": "scaler-container-0a1b2c3d",
        "KICI_AGENT_TOKEN": "token",
        "KICI_CONSOLE_PATIENCE_SECONDS": patience,
    }
    if kind == "kici_agent.sh":
        argv = [BUSYBOX, "sh", str(AGENT / "kici_agent.sh")]
        env = environ_for_guest(busybox_path(tmp_path), TMPDIR=str(tmp_path), **env)
    else:
        argv = [sys.executable, str(AGENT / "kici_agent.py")]
        env = environ_for_guest("/usr/bin:/bin", **env)
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def console():
    c = DownConsole()
    yield c
    c.close()


@pytest.mark.parametrize("kind", ["kici_agent.sh", "kici_agent.py"])
def test_an_agent_keeps_heartbeating_through_a_console_down_for_many_beats(console, tmp_path, kind):
    agent = _start(kind, console, tmp_path, patience="60")
    try:
        deadline = time.monotonic() + 30
        while console.beats < 15 and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.1)
        assert agent.poll() is None, agent.communicate()[0]  # still there after 15 dropped beats
        console.come_back()
        out = agent.communicate(timeout=20)[0]
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, out
    assert "heartbeat failed (15)" in out and "console asked us to stop" in out, out
    assert "heartbeat answered again after " in out, out  # its console says the console is back


@pytest.mark.parametrize("kind", ["kici_agent.sh", "kici_agent.py"])
def test_an_agent_gives_up_once_its_patience_is_spent(console, tmp_path, kind):
    started = time.monotonic()
    agent = _start(kind, console, tmp_path, patience="2")
    try:
        out = agent.communicate(timeout=30)[0]
    finally:
        if agent.poll() is None:
            agent.kill()
    took = time.monotonic() - started
    assert agent.returncode == 1, out
    assert "console unreachable for 2s; exiting" in out, out
    assert 1 <= took < 15, (took, out)  # the shell agent counts whole seconds
