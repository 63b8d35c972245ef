"""The private test dockerd refuses to serve while a foreign interface holds the agent gateway."""

import subprocess

import pytest

from tests.conftest import require_root
from tests.dockerd import DockerdUnavailable, _check_gateway_owner


def test_it_refuses_when_another_interface_holds_the_agent_gateway(dockerd):
    require_root()
    name = "kicit-gwguard"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "172.30.0.1/32", "dev", name], check=True)
        with pytest.raises(DockerdUnavailable, match=name):
            _check_gateway_owner()
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)
    _check_gateway_owner()  # and accepts the daemon's own bridge once the intruder is gone
