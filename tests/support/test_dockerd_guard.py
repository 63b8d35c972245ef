"""The private test dockerd refuses to serve while a foreign interface holds the agent gateway."""

import subprocess

import pytest

from tests.support.docker import DockerdUnavailable, _check_gateway_owner
from tests.support.root import require_root


def test_it_refuses_when_another_interface_holds_the_agent_gateway(dockerd):
    require_root()
    name = "kicit-gwguard"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "172.30.0.1/32", "dev", name], check=True)
        with pytest.raises(DockerdUnavailable, match=name) as refused:
            _check_gateway_owner()
        assert "`make stop-agents`" in str(refused.value)  # the command that ends make run's agents
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)
    _check_gateway_owner()  # and accepts the daemon's own bridge once the intruder is gone


def test_it_removes_a_bridge_a_stopped_dockerd_left_holding_the_gateway(dockerd, monkeypatch):
    require_root()
    import tests.support.docker as d

    name = "br-0badc0ffee00"
    monkeypatch.setattr(d, "_other_dockerd_running", lambda: False)
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "172.30.0.1/32", "dev", name], check=True)
        _check_gateway_owner()
        assert not subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def test_it_keeps_a_bridge_another_running_dockerd_owns(dockerd, monkeypatch):
    require_root()
    import tests.support.docker as d

    name = "br-0badc0ffee01"
    monkeypatch.setattr(d, "_other_dockerd_running", lambda: True)
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "172.30.0.1/32", "dev", name], check=True)
        with pytest.raises(DockerdUnavailable, match=name):
            _check_gateway_owner()
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


def test_a_daemon_another_session_uses_is_not_stopped(tmp_path, monkeypatch):
    """``stop`` (the end of one ``make test``, ``make run``'s start) leaves the daemon to a session
    or bench still using it; this process's own use does not count."""
    require_root()
    import sys

    import tests.support.docker as d

    users = tmp_path / "users"
    monkeypatch.setattr(d, "USERS_LOCKFILE", str(users))
    monkeypatch.setattr(d, "_users_hold", None)
    assert not d.in_use_by_another_process()
    d._hold_as_user()
    assert not d.in_use_by_another_process()  # only this process
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, time; f = open({str(users)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_SH); "
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert d.in_use_by_another_process()
        assert d.stop_private_dockerd() is False  # returned before touching any daemon
    finally:
        holder.kill()
        holder.wait(10)
    assert not d.in_use_by_another_process()
