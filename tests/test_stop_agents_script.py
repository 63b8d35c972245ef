"""``make stop-agents`` (``scripts/stop_agents.sh``) with no ``make run`` running starts nothing
when nothing of make run's agents is left, and says so; with something left (here a process-mode
agent writing into the agent logs) it goes on to start what the teardown needs, as before. Run in
a copy of the scripts, in a PID namespace of its own (so the machine's other processes are not
its traces), with the services it could start stood in for by commands that record the call."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.root import require_root

ROOT = Path(__file__).resolve().parent.parent
NOT_A_DAEMON = "unix:///run/kici-test-no-daemon.sock"
#: What the script could start: each stand-in records its name and fails.
STARTERS = ("pg_ctlcluster", "redis-server", "dockerd", "systemctl", "apt-get")

pytestmark = pytest.mark.root


@pytest.fixture
def checkout(tmp_path):
    """A copy of the scripts beside the real virtualenv, and a PATH whose starters only record."""
    require_root()
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copy(ROOT / "requirements.lock", tmp_path / "requirements.lock")
    (tmp_path / ".venv").symlink_to((ROOT / ".venv").resolve())
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in STARTERS:
        (stubs / name).write_text(f'#!/bin/sh\necho {name} >> "{tmp_path}/started"\nexit 1\n')
        (stubs / name).chmod(0o755)
    return tmp_path


def _stop_agents(checkout: Path, before: str = "") -> subprocess.CompletedProcess:
    env = {
        "PATH": f"{checkout / 'stubs'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "DOCKER_HOST": NOT_A_DAEMON,
        "KICI_NFT_TABLE": f"kici-none-{secrets.token_hex(3)}",
        "HOME": os.environ.get("HOME", "/root"),
    }
    script = f"{before} bash scripts/stop_agents.sh"
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_with_nothing_left_it_starts_nothing_and_says_so(checkout):
    done = _stop_agents(checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to stop, nothing started" in done.stdout, done.stdout
    assert not (checkout / "started").exists(), (checkout / "started").read_text()
    assert not (checkout / "var" / "run" / "redis").exists()
    assert "tearing down" not in done.stdout


def test_with_a_process_mode_agent_left_it_goes_on_to_end_it(checkout):
    (checkout / "var" / "agents").mkdir(parents=True)
    done = _stop_agents(checkout, before="sleep 60 >> var/agents/scaler-process-1.log & ")
    out = done.stdout + done.stderr
    assert f"left by make run: a process-mode agent writing into {checkout / 'var' / 'agents'}" in out, out
    assert "redis-server" in (checkout / "started").read_text()  # what the teardown needs is started
