"""What ``make run``'s stop leaves running (``stop_started_services`` in ``scripts/lib.sh``), run
under bash as ``make run`` runs it, against the private test dockerd. The dockerd ``make run``
started is stood in for by a ``sleep`` renamed ``dockerd`` (its pidfile names it), so the shared
test daemon is never the one stopped."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from scalers.backends.docker_net import ensure_isolated_network
from tests.support.root import require_root

ROOT = Path(__file__).resolve().parent.parent
NOT_A_DAEMON = "unix:///run/kici-test-no-daemon.sock"

pytestmark = pytest.mark.root


@pytest.fixture
def lib_copy(tmp_path):
    """``scripts/lib.sh`` copied into ``tmp_path`` (its ``var/`` is the copy's own); returns ``tmp_path``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lib.sh", tmp_path / "scripts" / "lib.sh")
    return tmp_path


@pytest.fixture
def fake_dockerd(lib_copy, tmp_path):
    """The pid of a process named ``dockerd`` (a ``sleep``, not this process's child: init reaps
    it), recorded in ``var/run/dockerd.pid`` of the copy of the scripts; killed afterwards."""
    binary = tmp_path / "dockerd"
    shutil.copy(shutil.which("sleep"), binary)
    started = subprocess.run(
        ["sh", "-c", f"{binary} 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    pid = int(started.stdout)
    (tmp_path / "var" / "run").mkdir(parents=True)
    (tmp_path / "var" / "run" / "dockerd.pid").write_text(f"{pid}\n")
    yield pid
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def nft_tables():
    """A unique console table name with its three tables (inet, bridge, netdev) created; dropped afterwards."""
    require_root()
    name = f"rststop{secrets.token_hex(2)}"
    for family in ("inet", "bridge", "netdev"):
        subprocess.run(["nft", "add", "table", family, name], check=True)
    yield name
    for family in ("inet", "bridge", "netdev"):
        subprocess.run(["nft", "delete", "table", family, name], check=False, capture_output=True)


def _has_table(family: str, name: str) -> bool:
    return subprocess.run(["nft", "list", "table", family, name], capture_output=True).returncode == 0


def _lib(tmp_path: Path, docker_host: str, table: str, script: str, *, check: bool = True) -> str:
    """Run ``script`` after sourcing the copied lib.sh; its stdout and stderr, escapes removed.
    Raises CalledProcessError when it fails and ``check``."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "DOCKER_HOST": docker_host}
    env["KICI_NFT_TABLE"] = table
    out = subprocess.run(
        ["bash", "-c", f". scripts/lib.sh; {script}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)


def _sleeper(docker_client, agent_image, **network):
    """A kici-managed container that only sleeps, attached as ``network`` says."""
    return docker_client.containers.run(
        agent_image,
        ["sleep 600"],
        entrypoint=["/bin/sh", "-c"],
        detach=True,
        labels={"kici-managed": "true", "kici-test": "run-stop"},
        **network,
    )


def test_the_stop_leaves_running_agents_their_dockerd_network_and_rules(
    tmp_path, dockerd, docker_client, agent_image, fake_dockerd, nft_tables
):
    ensure_isolated_network(docker_client)
    container = _sleeper(docker_client, agent_image, network="kici-agent-net")
    # kici-managed but on no agent network (someone's leftover, not an agent): not counted.
    stray = _sleeper(docker_client, agent_image, network_mode="none")
    try:
        out = _lib(
            tmp_path,
            dockerd,
            nft_tables,
            "ensure_dockerd; echo started=$STARTED_DOCKERD; stop_started_services",
        )
        assert f"reusing the dockerd an earlier make run left running (pid {fake_dockerd})" in out
        assert "started=1" in out
        agents = {"network": "kici-agent-net", "label": "kici-managed=true"}
        running = len(docker_client.containers.list(filters=agents))
        assert re.search(
            rf"left running: dockerd \(pid {fake_dockerd}\) with {running} agent container\(s\) on kici-agent-net "
            rf"and their isolation rules \(nft tables inet/bridge/netdev {nft_tables}\); "
            r"the next make run re-adopts them; "
            r"`make stop-agents` ends them",
            out,
        ), out
        container.reload()
        assert container.status == "running"
        assert _alive(fake_dockerd)
        assert all(_has_table(family, nft_tables) for family in ("inet", "bridge", "netdev"))
    finally:
        container.remove(force=True)
        stray.remove(force=True)


def test_with_no_agent_running_the_stop_ends_the_dockerd_it_started_and_the_tables(tmp_path, fake_dockerd, nft_tables):
    # No daemon answers: no agent container runs, so everything make run started goes.
    pid_file = tmp_path / "var" / "run" / "run.pid"
    out = _lib(tmp_path, NOT_A_DAEMON, nft_tables, f"echo $$ > {pid_file}; STARTED_DOCKERD=1; stop_started_services")
    assert "stopping the dockerd make run started" in out and "left running" not in out
    assert not _alive(fake_dockerd)  # the stop waited for it to go
    assert not any(_has_table(family, nft_tables) for family in ("inet", "bridge", "netdev"))
    assert not pid_file.exists()  # the next make stop-agents does not think make run still runs


def test_a_stop_leaves_the_pid_file_of_a_make_run_that_still_runs(tmp_path, fake_dockerd, nft_tables):
    pid_file = tmp_path / "var" / "run" / "run.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # another process: a make run still running
    _lib(tmp_path, NOT_A_DAEMON, nft_tables, "stop_started_services")
    assert pid_file.read_text() == f"{os.getpid()}\n"


def test_make_test_is_refused_beside_agents_make_run_left_naming_what_ends_them(
    lib_copy, dockerd, docker_client, agent_image
):
    ensure_isolated_network(docker_client)  # its bridge holds the gateway, as make run's does
    container = _sleeper(docker_client, agent_image, network="kici-agent-net")
    try:
        out = _lib(lib_copy, dockerd, "kici", "refuse_beside_left_agents; echo went-on", check=False)
        assert "went-on" not in out
        assert re.search(r"[1-9]\d* agent container\(s\) of make run still run on kici-agent-net", out), out
        assert "end them with `make stop-agents`" in out
    finally:
        container.remove(force=True)
    assert "went-on" in _lib(lib_copy, NOT_A_DAEMON, "kici", "refuse_beside_left_agents; echo went-on")
