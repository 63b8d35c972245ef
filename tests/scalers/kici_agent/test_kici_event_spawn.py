"""A KiCI scale-up's agent in a real container on the suite's dockerd: the spawn starts it with the
payload's agent id, orchestrator URL, labels and claim code (no orchestrator token minted), and the
scale-down removes it with its rules and reservation."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents.choices import AgentState
from agents.models import Agent, ScalerEvent
from scalers.backends.docker_net import ensure_isolated_network
from scalers.credentials import encrypt_secret
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.containers import remove_test_containers
from tests.support.kici_stand_in import ADMIN_TOKEN, stand_in_orchestrator
from tests.support.nft import nft_table_for
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.root]

TOKEN = "test-kici-event-spawn-token"
TABLE = "kev_kici"
CLAIM = "5eed" * 16
AGENT_ID = "scaler-event-5eed5eed"


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE, create=False)


#: An image that stays up, as the real agent does until it has claimed and run its job: the
#: console's own agent (``agent_image``) exits at once without ``KICI_AGENT_TOKEN``, which the
#: scale-up's agent never gets.
SLEEPER = "kici-event-sleeper:test"


@pytest.fixture
def sleeper_image(docker_client, agent_image):
    """``SLEEPER``: the agent image with ``sleep 600`` as its command (committed, no build)."""
    created = docker_client.api.create_container(agent_image, command=["true"])
    try:
        docker_client.api.commit(
            created["Id"], repository=SLEEPER.split(":")[0], tag="test", changes=['CMD ["sleep", "600"]']
        )
    finally:
        docker_client.api.remove_container(created["Id"], force=True)
    image = docker_client.api.inspect_image(SLEEPER)["Id"]
    yield SLEEPER
    remove_test_containers(docker_client)  # a failed test's container still uses the image
    docker_client.api.remove_image(image, force=True)


@pytest.fixture(autouse=True)
def no_leftover_containers(docker_client):
    yield
    remove_test_containers(docker_client)


def post(path: str, body: dict):
    return Client().post(path, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


@pytest.mark.usefixtures("stop_admission_queue")
def test_a_scale_up_starts_its_agent_in_a_container_and_the_scale_down_removes_it(
    docker_client, sleeper_image, nft_table, settings, run_rq_jobs
):
    settings.KICI_API_TOKEN = TOKEN
    ensure_isolated_network(docker_client)
    with stand_in_orchestrator() as orchestrator:
        OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
        url = f"ws://127.0.0.1:{orchestrator.port}/ws"
        make_scaler(
            labels=("linux-real",),
            ls_config={
                "image": sleeper_image,
                "imagePullPolicy": "Never",
                "kiciAgent": {"orchestratorUrl": url, "adminTokenRef": "orch"},
            },
        )
        payload = {
            "scalerName": "cloud",
            "agentId": AGENT_ID,
            "labels": ["linux-real", "kici:agent:event", "kici:scaler:cloud", "kici:role:builder"],
            "orchestratorUrl": url,
            "claimCode": CLAIM,
            "jobId": "job-1",
            "requestId": "req-1",
        }
        admitted = post("/api/v1/scale/kici-event/scale-up", payload)
        assert admitted.status_code == 201, admitted.content
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        agent = Agent.objects.get()
        events = list(ScalerEvent.objects.filter(agent=agent).values_list("type", "detail"))
        assert agent.agent_id == AGENT_ID and agent.managed_id, (agent.state, agent.failure_reason, events)
        assert agent.state in (AgentState.CONNECTING, AgentState.RUNNING), agent.failure_reason

        info = docker_client.api.inspect_container(agent.managed_id)
        env = dict(pair.split("=", 1) for pair in info["Config"]["Env"])
        assert env["KICI_AGENT_ID"] == AGENT_ID and env["KICI_SCALER_CLAIM_CODE"] == CLAIM
        assert env["KICI_ORCHESTRATOR_URL"] == url and env["KICI_LABELS"] == ",".join(payload["labels"])
        assert env["KICI_ROLES"] == "builder" and "KICI_AGENT_TOKEN" not in env
        assert info["Config"]["Labels"]["kici-agent-id"] == AGENT_ID
        assert not [call for call in orchestrator.calls if call[0] == "POST"], orchestrator.calls  # nothing minted

        down = post(
            "/api/v1/scale/kici-event/scale-down",
            {"scalerName": "cloud", "agentId": AGENT_ID, "reason": "job-complete", "requestId": "d-1"},
        )
        assert down.status_code == 200 and down.json()["state"] == "destroying", down.content
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        agent.refresh_from_db()
        assert agent.state == AgentState.DESTROYED, agent.failure_reason
        assert not docker_client.api.containers(all=True, filters={"id": info["Id"]})
        assert not Reservation.objects.exists()
        assert not [call for call in orchestrator.calls if call[0] == "DELETE"]  # no token to revoke
