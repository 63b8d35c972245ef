"""A console restart is not an outage: a real console (daphne, an rq worker, the sweeper; see
``tests/support/soak.py``) spawns a real container agent on the private dockerd with network
isolation on; every console process is stopped (SIGTERM) and started again. The agent's container
keeps running through it, and the restarted console keeps the agent: still registered and running,
heartbeating to the new processes, its isolation rules re-checked and put back (they are removed
while the console is down), and not ended by the lost-agent sweep."""

from __future__ import annotations

import secrets
import time

import pytest
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from network.nft.apply import NftClient
from scalers.models import RecoveryReport
from tests.support.soak import Orchestrator, run_console, scaler_containers

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TABLE = "rst_kici"
#: Seconds the restarted console is watched: longer than two lost-agent sweeps (every 5 s) and
#: two heartbeats (every 5 s).
WATCH_SECONDS = 14.0


def _wait(done, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = done()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"not within {timeout:g} s: {what}")


def _running(docker_host: str, scaler) -> list[str]:
    """Ids of the scaler's running containers."""
    return [c["Id"] for c in scaler_containers(docker_host, scaler) if c["State"] == "running"]


def test_a_restarted_console_keeps_its_running_container_agent(tmp_path, dockerd, agent_image, settings):
    settings.KICI_NFT_TABLE = TABLE
    nft = NftClient(TABLE)
    with run_console(
        tmp_path, backend="container", max_agents=1, workers=1, docker_host=dockerd, nft_table=TABLE
    ) as console:
        orchestrator = Orchestrator(console, seed=0)
        job_id = f"restart-job-{secrets.token_hex(2)}"
        admitted = orchestrator.scale(job_id, time.monotonic() + 30)
        assert not isinstance(admitted, str), admitted
        agent_id = admitted[0]
        registered = orchestrator.wait_registered(agent_id)
        assert not isinstance(registered, str), registered
        agent = Agent.objects.get(agent_id=agent_id)
        ip = agent.ip
        _wait(lambda: ip in {str(a) for a in nft.list_agents()}, 10, f"rules of {ip}")

        launcher = console.launcher
        launcher.stop_all()
        stopped = timezone.now()
        assert _running(dockerd, console.scaler) == [agent.managed_id], "the stop ended the agent's container"
        nft.remove_agent(ip)  # lost while the console was down: the restarted one must put them back
        assert ip not in {str(a) for a in nft.list_agents()}

        launcher.start_all()  # waits until daphne answers again
        _wait(
            lambda: RecoveryReport.objects.filter(created_at__gt=stopped, trigger="boot").exists(),
            30,
            "the sweeper's boot recovery",
        )
        beats = _wait(
            lambda: Agent.objects.filter(agent_id=agent_id, last_heartbeat__gt=stopped).first(),
            20,
            "a heartbeat to the restarted console",
        )
        assert beats.state == AgentState.RUNNING and beats.registered_at == agent.registered_at
        _wait(lambda: ip in {str(a) for a in nft.list_agents()}, 20, f"rules of {ip} re-applied")
        time.sleep(WATCH_SECONDS)
        kept = Agent.objects.get(agent_id=agent_id)
        assert kept.state == AgentState.RUNNING and not kept.lost, (kept.state, kept.lost, kept.failure_reason)
        assert kept.last_heartbeat > beats.last_heartbeat
        assert _running(dockerd, console.scaler) == [agent.managed_id]
        assert ip in {str(a) for a in nft.list_agents()}

        orchestrator.post(f"/api/v1/agents/{agent_id}/job-complete", {"jobId": job_id})
        _wait(
            lambda: Agent.objects.filter(agent_id=agent_id, state=AgentState.DESTROYED).exists(),
            60,
            "the agent destroyed after its job",
        )
        assert scaler_containers(dockerd, console.scaler) == []
