"""The Firecracker guest's MMDS reader (sandbox_agent/guest_mmds.sh) starting the real KiCI agent (v0.1.24):
the console's MMDS document for a VM of a ``kiciAgent`` label set, served at the MMDS address to a
network namespace standing in for the guest, makes the real agent register with the real
orchestrator and exit once idle. The reader's own ``KICI_*`` settings are in its environment, so
the agent (which refuses any ``KICI_*`` it does not know) starts only if the reader gave it exactly
its own variables; an unknown one carried in ``kici-env`` makes it refuse.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from scalers.backends.firecracker import jail
from scalers.backends.spawn_env import kici_agent_pairs
from scalers.kici_orchestrator import token_labels
from tests.support.guest import REPO, Mmds, busybox_path, serve_in_netns
from tests.support.scalers import make_agent, make_scaler

pytestmark = [pytest.mark.kici_real, pytest.mark.root, pytest.mark.slow, pytest.mark.django_db]

READER = REPO / "sandbox_agent" / "guest_mmds.sh"


def _guest_namespace(orchestrator_netns: str) -> tuple[str, str]:
    """A namespace with an unconfigured-then-configured eth0, veth-joined to the orchestrator's
    namespace, whose side holds the gateway and the MMDS address. Returns ``(name, gateway)``."""
    octet = 10 + os.getpid() % 200
    name, gateway, ip = f"kicifcg-{os.getpid()}", f"10.254.{octet}.1", f"10.254.{octet}.2"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "link", "add", "kfcg0", "netns", orchestrator_netns, "type", "veth", "peer", "name", "eth0",
                    "netns", name], check=True)  # fmt: skip
    for addr in (f"{gateway}/24", f"{jail.MMDS_ADDRESS}/32"):
        subprocess.run(["ip", "-n", orchestrator_netns, "addr", "add", addr, "dev", "kfcg0"], check=True)
    subprocess.run(["ip", "-n", orchestrator_netns, "link", "set", "kfcg0", "up"], check=True)
    subprocess.run(["ip", "-n", name, "addr", "add", f"{ip}/24", "dev", "eth0"], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "eth0", "up"], check=True)
    subprocess.run(["ip", "-n", name, "route", "add", jail.MMDS_ADDRESS, "dev", "eth0"], check=True)
    return name, gateway


@pytest.mark.parametrize("extra", [None, ("KICI_NOT_A_SETTING", "1")], ids=["exact", "unknown-variable"])
def test_the_guest_reader_starts_the_real_agent_from_the_consoles_mmds_document(kici_orchestrator, extra):
    orchestrator = kici_orchestrator
    guest, gateway = _guest_namespace(orchestrator.netns)
    # Outside /tmp, which the guest side gets as a tmpfs of its own (with /root): the agent's
    # files stay there.
    work = Path(tempfile.mkdtemp(prefix="kici-fcguest-", dir="/run"))
    server = None
    try:
        scaler = make_scaler(
            type="firecracker", labels=("fc-real",),
            ls_config={"kiciAgent": {"orchestratorUrl": f"ws://{gateway}:8480/ws", "adminTokenRef": "orch"}},
        )  # fmt: skip
        agent = make_agent(scaler)
        token = orchestrator.mint_agent_token(token_labels(agent.label_set, agent.scaler.roles))
        pairs = kici_agent_pairs(agent, token, execution_mode="firecracker") + ([extra] if extra else [])
        mmds = Mmds(version="V2")
        mmds.data.update(jail.agent_env_mmds(pairs, gateway))
        server = serve_in_netns(orchestrator.netns, jail.MMDS_ADDRESS, 80, mmds.handler())
        launcher = work / "kici-agent"
        launcher.write_text(f"#!/bin/sh\nexec {orchestrator.build.node} {orchestrator.build.agent}\n")
        launcher.chmod(0o755)
        settings = {"PATH": busybox_path(work), "HOME": "/root", "KICI_REAL_AGENT": str(launcher),
                    "KICI_MMDS_WAIT_SECONDS": "10"}  # fmt: skip
        process = subprocess.Popen(
            ["ip", "netns", "exec", guest, "env", "-i", *[f"{k}={v}" for k, v in settings.items()],
             "/usr/bin/unshare", "-m", "--propagation", "private", "/bin/busybox", "sh", "-c",
             'mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /root && exec /bin/busybox sh "$0"', str(READER)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"the real agent did not exit within 120 s:\n{output[-4000:]}")
        assert f"kici-mmds: real KiCI agent {agent.agent_id}, orchestrator ws://{gateway}:8480/ws" in output, output
        registered = [line for line in orchestrator.log().splitlines() if "Agent registered" in line]
        if extra is None:
            # Registered, idle, and out by itself (scaler-managed): status 0.
            assert process.returncode == 0, output[-4000:]
            assert len(registered) == 1 and agent.agent_id in registered[0], registered
        else:
            assert process.returncode == 1, output[-4000:]
            assert "KICI_NOT_A_SETTING" in output, output[-4000:]
            assert registered == []
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        subprocess.run(["ip", "netns", "del", guest], check=False)
        shutil.rmtree(work, ignore_errors=True)
