"""The real KiCI agent against the real orchestrator (v0.1.24), both in a namespace the test made."""

from __future__ import annotations

import pytest

from tests.support.kici_real import run_agent, wait_for

pytestmark = [pytest.mark.kici_real, pytest.mark.root, pytest.mark.slow]


def _cluster_agent_count(orchestrator) -> int | None:
    status, body = orchestrator.get("/cluster/health")
    assert status == 200, body
    return body["agentCount"]


def test_the_real_agent_registers_with_a_minted_token(kici_orchestrator, tmp_path):
    labels = ["e2e-linux", "e2e-x64"]
    token = kici_orchestrator.mint_agent_token(labels)
    assert _cluster_agent_count(kici_orchestrator) == 0

    workdir = tmp_path / "agent"
    with run_agent(kici_orchestrator, workdir, token=token, agent_id="e2e-agent-1", labels=labels, roles="") as agent:
        wait_for(
            lambda: _cluster_agent_count(kici_orchestrator) == 1,
            30,
            "agent registration seen by /cluster/health",
            tmp_path / "agent" / "agent.log",
            agent,
        )
        registered = [line for line in kici_orchestrator.log().splitlines() if "Agent registered" in line]
        assert len(registered) == 1 and "e2e-agent-1" in registered[0], registered
