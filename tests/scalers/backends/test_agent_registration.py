"""The agents the project ships register even when the console is down while they boot."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.support.guest import BUSYBOX, Console, busybox_path, environ_for_guest
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[3]

#: Longer than the registration budget the agents had before (10 attempts, 1 s apart): a console
#: restart whose workers finish their jobs first takes about this long.
CONSOLE_DOWN_SECONDS = 14


def test_every_agent_registers_once_the_console_is_back_after_a_restart(tmp_path):
    """The reference agents (container and VM shell agent, bare-metal Python agent) and the soak's
    agent keep retrying registration while nothing listens, and register when the console comes
    back; then the console's ``stop`` ends them with status 0."""
    control = tmp_path / "control"
    control.mkdir()
    host_path = "/usr/bin:/bin"
    programs = {  # name: (argv, PATH, more environment)
        "kici_agent.sh": ([BUSYBOX, "sh", str(ROOT / "sandbox_agent" / "kici_agent.sh")], busybox_path(tmp_path), {}),
        "kici_agent.py": ([sys.executable, str(ROOT / "sandbox_agent" / "kici_agent.py")], host_path, {}),
        "soak_agent.py": (
            [sys.executable, str(ROOT / "bench" / "agents" / "soak_agent.py")],
            host_path,
            {"SOAK_CONTROL_DIR": str(control)},
        ),
    }
    runs = {}
    for i, (name, (argv, path, extra)) in enumerate(programs.items()):
        port = free_port()
        console = Console(f"scaler-container-0000000{i}", f"token-{i}")
        env = environ_for_guest(
            path,
            KICI_ORCHESTRATOR_URL=f"http://127.0.0.1:{port}",
            KICI_AGENT_ID=console.agent_id,
            KICI_AGENT_TOKEN=console.token,
            KICI_LABELS="linux",
            **extra,
        )
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        runs[name] = (port, console, proc)
    servers = []
    try:
        time.sleep(CONSOLE_DOWN_SECONDS)  # nothing listens: every attempt is refused
        for name, (_, _, proc) in runs.items():
            assert proc.poll() is None, f"{name} gave up while the console was down:\n{proc.communicate()[0]}"
        for port, console, _ in runs.values():
            server = ThreadingHTTPServer(("127.0.0.1", port), console.handler())
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
        for name, (_, console, proc) in runs.items():
            out = proc.communicate(timeout=30)[0]
            assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out}"
            assert [r[0] for r in console.requests][:1] == ["/api/v1/agents/register"], (name, console.requests)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        for _, _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
