"""The OpenAPI document is usable, not only valid: a client generated from it by
``openapi-python-client`` (pinned) drives one agent's lifecycle on a real daphne over both APIs:
the orchestrator asks for an agent and follows it, the agent registers with its one-time token and
heartbeats with its session, the orchestrator ends the job, and the next heartbeat says stop.

No container runs: the agent's side is played by the test with the registration token minted for
the admitted agent (what the backend would hand the sandbox)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from agents.models import Agent
from agents.tokens import mint_registration_token
from scalers.openapi import build_document
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]

TOKEN = "test-orchestrator-token"
PACKAGE = "kici_client"


@pytest.fixture
def client_package(tmp_path):
    """The client generated from the document into ``tmp_path``, imported; unloaded afterwards."""
    (tmp_path / "openapi.json").write_text(json.dumps(build_document()))
    (tmp_path / "config.yaml").write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\n")
    generated = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(tmp_path / "openapi.json"),
            "--config",
            str(tmp_path / "config.yaml"),
            "--meta",
            "none",
            "--output-path",
            str(tmp_path / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert "Warning" not in generated.stdout + generated.stderr, generated.stdout + generated.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture
def _api_token(settings):
    settings.KICI_API_TOKEN = TOKEN


@pytest.mark.usefixtures("_api_token")
def test_a_generated_client_drives_one_lifecycle(client_package, daphne_server):
    make_scaler("c", labels=("linux", "ctr"), max_agents=1)
    api = importlib.import_module(f"{PACKAGE}.api.orchestrator")
    agent_api = importlib.import_module(f"{PACKAGE}.api.agent")
    models = importlib.import_module(f"{PACKAGE}.models")
    for name in ("scale", "get_agent", "job_complete", "list_agents"):
        importlib.import_module(f"{PACKAGE}.api.orchestrator.{name}")
    for name in ("register_agent", "heartbeat"):
        importlib.import_module(f"{PACKAGE}.api.agent.{name}")
    orchestrator = client_package.AuthenticatedClient(base_url=daphne_server, token=TOKEN)

    admitted = api.scale.sync_detailed(
        client=orchestrator, body=models.ScaleRequestBody(labels=["linux", "ctr"], job_id="job-1")
    )
    assert admitted.status_code == 201, admitted.content
    assert isinstance(admitted.parsed, models.ScaleAdmitted) and admitted.parsed.scaler == "c"
    agent_id = admitted.parsed.agent_id

    full = api.scale.sync_detailed(client=orchestrator, body=models.ScaleRequestBody(labels=["linux"], job_id="j2"))
    assert full.status_code == 409 and isinstance(full.parsed, models.AtCapacity)
    assert full.parsed.retry_after_seconds > 0 and full.headers["Retry-After"]

    followed = api.get_agent.sync(agent_id, client=orchestrator)
    assert isinstance(followed, models.AgentView) and followed.job_id == "job-1"

    # The agent's side: register with the one-time token its sandbox would get, then heartbeat.
    registration = client_package.AuthenticatedClient(
        base_url=daphne_server, token=mint_registration_token(Agent.objects.get(agent_id=agent_id))
    )
    registered = agent_api.register_agent.sync(client=registration, body=models.RegisterBody(agent_id=agent_id))
    assert isinstance(registered, models.Registered) and registered.bound_job_id == "job-1"
    session = client_package.AuthenticatedClient(base_url=daphne_server, token=registered.session_token)
    beat = agent_api.heartbeat.sync(agent_id, client=session, body=models.HeartbeatBody(active_jobs=1))
    assert isinstance(beat, models.HeartbeatAnswer) and (beat.state, beat.stop) == ("running", False)

    page = api.list_agents.sync(client=orchestrator, job_id="job-1")
    assert isinstance(page, models.AgentPage) and [a.agent_id for a in page.agents] == [agent_id]

    wrong = api.job_complete.sync_detailed(agent_id, client=orchestrator, body=models.JobCompleteBody(job_id="x"))
    assert wrong.status_code == 409 and wrong.parsed.error.field == "jobId"
    done = api.job_complete.sync(agent_id, client=orchestrator, body=models.JobCompleteBody(job_id="job-1"))
    assert isinstance(done, models.AgentView) and done.state == "destroying"

    stop = agent_api.heartbeat.sync(agent_id, client=session, body=models.HeartbeatBody(active_jobs=0))
    assert isinstance(stop, models.HeartbeatAnswer) and stop.stop is True
