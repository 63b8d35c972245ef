"""The console runs the real KiCI agent as a bare-metal process: a ``kiciAgent`` label set whose
``binaryPath`` starts the cached build's agent, a token the real orchestrator minted for it; the
agent registers, exits by itself once idle, and the console ends it with its token revoked.

The orchestrator runs in a network namespace of the test's own, and so does the agent: its
``binaryPath`` is a script that enters that namespace (as root, a scaler-managed agent appends an
iptables rule to its namespace's OUTPUT chain, which must not be the host's). The console reaches
the orchestrator's admin interface through a forwarder on the host's loopback (``adminUrl``).
"""

from __future__ import annotations

import stat
import time

import pytest

from agents.choices import AgentState
from agents.models import Agent
from scalers.credentials import encrypt_secret
from scalers.jobs import spawn_agent
from scalers.kici_agents import look_at
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.kici_real import (
    ORCHESTRATOR_PORT,
    gateway_forwarder,
    own_database,
    private_netns,
    run_orchestrator,
)
from tests.support.scalers import make_agent, make_scaler

pytestmark = [
    pytest.mark.kici_real,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

LABEL = "real-host"


@pytest.fixture
def orchestrator_in_netns(kici_real_build, tmp_path):
    """``(orchestrator, admin port on the host's loopback)``."""
    with private_netns() as netns, own_database() as database_url:
        with gateway_forwarder(netns, "127.0.0.1") as port:
            with run_orchestrator(kici_real_build, netns, tmp_path / "orchestrator", database_url) as orch:
                yield orch, port


def _reload(agent) -> Agent:
    return Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk)


def _follow_until(agent, outcomes: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    outcome = ""
    while time.monotonic() < deadline:
        outcome = look_at(_reload(agent))
        if outcome in outcomes:
            return outcome
        time.sleep(0.5)
    return outcome


def test_the_console_spawns_the_real_agent_as_a_process_that_registers_and_ends_with_its_token(
    orchestrator_in_netns, kici_real_build, settings, tmp_path, monkeypatch
):
    orchestrator, admin_port = orchestrator_in_netns
    monkeypatch.setattr("scalers.jobs.schedule_follow", lambda agent: None)  # the test looks itself
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    OrchestratorAdminToken.objects.create(name="real-orch", secret=encrypt_secret(orchestrator.admin_token))
    binary = tmp_path / "kici-agent"
    binary.write_text(
        "#!/bin/sh\n"
        f"PATH={kici_real_build.path_env()}\nexport PATH\n"
        f"exec ip netns exec {orchestrator.netns} {kici_real_build.node} {kici_real_build.agent}\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    scaler = make_scaler(
        type="bare-metal",
        labels=(LABEL,),
        roles=["builder"],
        ls_config={
            "binaryPath": str(binary),
            "kiciAgent": {
                "orchestratorUrl": f"ws://127.0.0.1:{ORCHESTRATOR_PORT}/ws",
                "adminUrl": f"http://127.0.0.1:{admin_port}",
                "adminTokenRef": "real-orch",
            },
        },
    )
    agent = make_agent(scaler)
    assert spawn_agent(agent.pk) == "spawned"
    assert _follow_until(agent, {"running", "failed", "expired"}, 60) == "running", _reload(agent).failure_reason
    assert "Agent registered" in orchestrator.log() and agent.agent_id in orchestrator.log()
    status, body = orchestrator.get("/api/v1/agent-tokens")
    [minted] = body["tokens"]
    assert minted["id"] == _reload(agent).backend_context["kici_token_id"]
    assert sorted(minted["labels"]) == sorted([LABEL, "kici:role:builder"])
    assert _follow_until(agent, {"destroyed"}, 60) == "destroyed"
    agent = _reload(agent)
    assert agent.state == AgentState.DESTROYED
    assert agent.teardown_reason == "the KiCI agent exited with code 0 (it shuts down once idle)"
    # Its output file said it was idle between registering and exiting (it ran no job).
    assert (agent.active_jobs, agent.backend_context.get("kici_activity")) == (
        0,
        {"state": "idle", "jobId": "", "runId": ""},
    ), agent.backend_context
    status, body = orchestrator.get("/api/v1/agent-tokens")
    assert status == 200 and body["tokens"] == [], body
    assert not Reservation.objects.filter(agent=agent).exists()
