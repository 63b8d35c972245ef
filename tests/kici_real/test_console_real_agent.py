"""The console runs the real KiCI agent in its own sandbox: a ``kiciAgent`` label set, an isolated
container on the suite's private dockerd, a token the real orchestrator minted for it, and a real
workflow's job run to the end; then the agent exits by itself and the console frees its slot.

The orchestrator runs in a network namespace of the test's own; a forwarder the test starts on the
agents' gateway (172.30.0.1, on the private dockerd's bridge) is its only way in, so the agent
reaches it there, where its label set's host access allows, and nowhere else.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from datetime import datetime

import pytest
from django.test import Client

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from network.nft.apply import describe_agent_rules
from scalers import kici_agents
from scalers.backends import kici_token, spawn_env
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ensure_isolated_network
from scalers.credentials import encrypt_secret
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.containers import remove_test_containers
from tests.support.docker import docker_client as make_docker_client
from tests.support.kici_real import (
    add_local_repo,
    console_activity,
    finished_run,
    gateway_forwarder,
    own_database,
    private_netns,
    push_webhook,
    real_agent_image,
    real_agent_volumes,
    run_job,
    run_orchestrator,
)
from tests.support.nft import nft_table_for
from tests.support.scalers import make_scaler

pytestmark = [
    pytest.mark.kici_real,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.docker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("stop_admission_queue"),
]

API_TOKEN = "test-real-agent-api-token"
GREETING = "hello from the real agent in a console sandbox"
LABEL = "real-linux"
TABLE = "ctr_kici_real"
WORKFLOW = f"""import {{ workflow, job, step, push }} from '@kici-dev/sdk';

export const sandboxWorkflow = workflow('sandbox', {{
  on: push(),
  jobs: [
    job('greet', {{
      runsOn: 'kici:os:linux',
      steps: [
        step('say-hello', async ({{ $ }}) => {{
          await $`echo "{GREETING}"`;
          await $`echo "{GREETING}" > /proc/1/fd/1`;
          await $`sleep 6`;
        }}),
      ],
    }}),
  ],
}});
"""


@pytest.fixture(scope="module")
def gateway_orchestrator(kici_real_build, dockerd, tmp_path_factory):
    """The real orchestrator in its own namespace, reachable from the agents' network only at
    ``ws://172.30.0.1:<port>/ws`` (the test's forwarder), with a repo ``acme/demo`` holding the
    workflow registered as its ``local`` source. Yields ``(orchestrator, port, sha)``."""
    client = make_docker_client()
    try:
        ensure_isolated_network(client)
    finally:
        client.close()
    workdir = tmp_path_factory.mktemp("gateway-orchestrator")
    with private_netns() as netns, own_database() as database_url:
        with gateway_forwarder(netns, ISOLATED_NETWORK_GATEWAY) as port:
            public = f"http://{ISOLATED_NETWORK_GATEWAY}:{port}"
            with run_orchestrator(kici_real_build, netns, workdir / "orchestrator", database_url, public) as orch:
                repos = workdir / "repos"
                sha = add_local_repo(orch, repos, "sandbox", WORKFLOW)
                yield orch, port, sha, repos


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE)


@pytest.fixture
def real_scaler(gateway_orchestrator, kici_real_build, docker_client, nft_table, settings):
    """A container scaler whose label set ``real-linux`` runs the real agent of that orchestrator;
    the admin token is stored encrypted. Its containers are removed afterwards."""
    orchestrator, port, _, repos = gateway_orchestrator
    settings.KICI_API_TOKEN = API_TOKEN
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    OrchestratorAdminToken.objects.create(name="test-orch", secret=encrypt_secret(orchestrator.admin_token))

    def make(**ls_config):
        config = {
            "image": real_agent_image(docker_client.api, kici_real_build),
            "imagePullPolicy": "Never",
            "volumes": real_agent_volumes(kici_real_build, str(repos)),
            "kiciAgent": {
                "orchestratorUrl": f"ws://{ISOLATED_NETWORK_GATEWAY}:{port}/ws",
                "adminTokenRef": "test-orch",
            },
            **ls_config,
        }
        return make_scaler(labels=(LABEL,), ls_config=config)

    yield make
    remove_test_containers(docker_client)


def _scale(job_id: str) -> Agent:
    answer = Client().post(
        "/api/v1/scale",
        data=json.dumps({"labels": [LABEL], "jobId": job_id}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {API_TOKEN}",
    )
    assert answer.status_code == 201, answer.content
    return Agent.objects.select_related("scaler", "label_set").get(agent_id=answer.json()["agentId"])


def _state(agent: Agent) -> str:
    return Agent.objects.filter(pk=agent.pk).values_list("state", flat=True).first()


def _probe(docker_client, container_id: str, host: str, port: int) -> bool:
    """Whether a TCP connection from inside the container to ``host:port`` opens within 3 s."""
    result = docker_client.api.exec_create(
        container_id, ["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"]
    )
    docker_client.api.exec_start(result["Id"])
    return docker_client.api.exec_inspect(result["Id"])["ExitCode"] == 0


def _orchestrator_tokens(orchestrator) -> list[dict]:
    status, body = orchestrator.get("/api/v1/agent-tokens")
    assert status == 200, body
    return body["tokens"]


def _docker_time(value: str) -> float:
    """A docker timestamp (RFC 3339 with nanoseconds) as epoch seconds."""
    head, _, rest = value.partition(".")
    fraction = rest.rstrip("Z")[:6]
    return datetime.fromisoformat(f"{head}.{fraction}+00:00").timestamp()


def test_the_console_runs_a_real_job_on_the_real_agent_in_its_sandbox(
    gateway_orchestrator, real_scaler, docker_client, drive_rq, admin_client, nft_table, monkeypatch
):
    orchestrator, port, sha, _ = gateway_orchestrator
    real_scaler()
    # A probe target on the gateway that the sandbox's host access does not name.
    other = socket.socket()
    other.bind((ISOLATED_NETWORK_GATEWAY, 0))
    other.listen(4)
    other_port = other.getsockname()[1]

    pushed: dict = {}
    pusher = threading.Thread(
        target=lambda: pushed.update(answer=push_webhook(orchestrator, "acme", "demo", sha, timeout=150))
    )
    pusher.start()
    agent = _scale("job-real-1")
    assert drive_rq(lambda: _state(agent) != AgentState.CONNECTING and _state(agent) != AgentState.SPAWNING, 90)
    agent.refresh_from_db()
    assert agent.state == AgentState.RUNNING, agent.failure_reason

    info = docker_client.api.inspect_container(agent.managed_id)
    env = dict(item.split("=", 1) for item in info["Config"]["Env"])
    kici_env = {k: v for k, v in env.items() if k.startswith("KICI_")}
    token = kici_env.pop("KICI_AGENT_TOKEN")
    assert token.startswith("kat_")
    assert kici_env == {
        "KICI_ORCHESTRATOR_URL": f"ws://{ISOLATED_NETWORK_GATEWAY}:{port}/ws",
        "KICI_AGENT_ID": agent.agent_id,
        "KICI_LABELS": LABEL,
        "KICI_SCALER_MANAGED": "1",
        "KICI_EXECUTION_MODE": "bare-metal",
    }
    assert agent.host_access == [f"{ISOLATED_NETWORK_GATEWAY}:{port}"]
    address = agent.ip
    [minted] = _orchestrator_tokens(orchestrator)
    assert minted["id"] == agent.backend_context["kici_token_id"]
    assert sorted(minted["labels"]) == sorted([LABEL, "kici:role:builder", "kici:role:init-runner"])

    # The job runs; probe from inside the sandbox meanwhile. The agent's exit is read from docker
    # just before the console tears the agent down, the slot's release just after.
    ends: dict = {}
    real_teardown = kici_agents.teardown_agent

    def teardown(exited, reason, **kwargs):
        ends["exited"] = _docker_time(docker_client.api.inspect_container(exited.managed_id)["State"]["FinishedAt"])
        released = real_teardown(exited, reason, **kwargs)
        ends["freed"], ends["released"] = time.time(), released
        return released

    monkeypatch.setattr(kici_agents, "teardown_agent", teardown)
    probes = None
    # What the console's row says the agent does, each change in order; and the agent list and
    # page, read while the orchestrator says the greet job runs on it and the row says it is busy.
    seen: list[tuple[int, dict | None]] = []
    shown: dict[str, str] = {}

    def busy_with(job_id: str) -> bool:
        """Record the row's activity when it changed; whether it says busy with ``job_id``."""
        now = console_activity(agent)
        if "freed" not in ends and (not seen or seen[-1] != now):
            seen.append(now)
        return bool(now[1] and now[1]["jobId"] == job_id)

    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and "freed" not in ends:
        drive_rq(lambda: True, 0)
        busy_with("")
        greet = run_job(orchestrator)
        if greet.get("status") != "running":
            time.sleep(0.2)
            continue
        # The step sleeps 6 s: the follow (one look a second) finds the job in the agent's log.
        if not shown and drive_rq(functools.partial(busy_with, greet["jobId"]), 4):
            shown["list"] = admin_client.get("/agents/").content.decode()
            shown["page"] = admin_client.get(f"/agents/{agent.agent_id}/").content.decode()
        if probes is None:  # each closed port takes its 3 s timeout
            probes = {
                "orchestrator": _probe(docker_client, agent.managed_id, ISOLATED_NETWORK_GATEWAY, port),
                "gateway other port": _probe(docker_client, agent.managed_id, ISOLATED_NETWORK_GATEWAY, other_port),
                "gateway dns": _probe(docker_client, agent.managed_id, ISOLATED_NETWORK_GATEWAY, 53),
            }
    pusher.join(30)
    other.close()

    run, jobs = finished_run(orchestrator)
    assert pushed["answer"][0] in (200, 202), pushed
    assert (run["workflowName"], run["sha"]) == ("sandbox", sha), run
    assert {(j["jobName"], j["status"], j["agentId"]) for j in jobs} == {
        ("__build__sandbox", "success", agent.agent_id),
        ("greet", "success", agent.agent_id),
    }, jobs
    assert probes == {"orchestrator": True, "gateway other port": False, "gateway dns": False}, probes
    # Busy with the greet job while it ran (as the orchestrator's record says), idle after it, then ended.
    greet_id, builder_id = (next(j["jobId"] for j in jobs if j["jobName"] == n) for n in ("greet", "__build__sandbox"))
    run_id = run["runId"]
    busy_greet = (1, {"state": "busy", "jobId": greet_id, "runId": run_id})
    idle = (0, {"state": "idle", "jobId": "", "runId": ""})
    assert seen[-2:] == [busy_greet, idle], seen
    assert all(a in (idle, busy_greet, (1, {**busy_greet[1], "jobId": builder_id}), (0, None)) for a in seen), seen
    assert shown, seen  # the row said busy with the greet job while the orchestrator said it ran
    assert f"busy: job {greet_id}" in shown["list"], shown["list"][-3000:]
    assert f"busy: job <code>{greet_id}</code>" in shown["page"] and f"run <code>{run_id}</code>" in shown["page"]
    registered = [line for line in orchestrator.log().splitlines() if "Agent registered" in line]
    assert any(agent.agent_id in line for line in registered), registered

    agent.refresh_from_db()
    assert agent.state == AgentState.DESTROYED, (agent.state, agent.failure_reason)
    assert "the KiCI agent exited with code 0 (it shuts down once idle)" in agent.teardown_reason
    kinds = list(ScalerEvent.objects.filter(agent=agent).order_by("pk").values_list("type", flat=True))
    assert kinds.index(EventType.REGISTERED) < kinds.index(EventType.DESTROYED), kinds
    assert ends["released"] is True, ends
    assert not Reservation.objects.filter(agent=agent).exists()
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
    assert describe_agent_rules(nft_table, address) == [f"no isolation rules in force for {address}"]
    assert _orchestrator_tokens(orchestrator) == []

    page = admin_client.get(f"/agents/{agent.agent_id}/console/")
    assert page.status_code == 200 and GREETING in page.content.decode(), page.content[-2000:]

    greet = next(j for j in jobs if j["jobName"] == "greet")
    registered_after = (agent.registered_at - agent.created_at).total_seconds()
    print(
        f"\nreal agent figures: scale -> registered (console) {registered_after:.1f} s, "
        f"job start -> end (orchestrator) {greet.get('durationMs')} ms (the step sleeps 6 s), "
        f"agent exit -> slot free {ends['freed'] - ends['exited']:.2f} s; "
        f"the greeting {page.content.decode().count(GREETING)} times on the console page"
    )


def _ends(agent: Agent, drive_rq, timeout: float) -> Agent:
    """Drive the spawn and follow jobs until ``agent`` has ended; returns its row."""
    assert drive_rq(lambda: _state(agent) in (AgentState.FAILED, AgentState.DESTROYED), timeout), _state(agent)
    return Agent.objects.get(pk=agent.pk)


def _nothing_left(agent: Agent, orchestrator, docker_client) -> None:
    assert not Reservation.objects.filter(agent=agent).exists()
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})
    assert _orchestrator_tokens(orchestrator) == []


def test_an_unknown_kici_variable_makes_the_real_agent_refuse_and_the_spawn_fail(
    gateway_orchestrator, real_scaler, docker_client, drive_rq, monkeypatch
):
    orchestrator = gateway_orchestrator[0]
    real_scaler()
    real_env = spawn_env.kici_agent_env
    monkeypatch.setattr(
        spawn_env, "kici_agent_env", lambda agent, token: [*real_env(agent, token), "KICI_RUNTIME_IMAGE=x"]
    )
    agent = _ends(_scale("job-real-env"), drive_rq, 60)
    assert agent.state == AgentState.FAILED
    assert "the KiCI agent exited with code 1 without registering" in agent.failure_reason, agent.failure_reason
    failed = ScalerEvent.objects.get(agent=agent, type=EventType.FAILED)
    assert "KICI_RUNTIME_IMAGE" in failed.detail, failed.detail
    _nothing_left(agent, orchestrator, docker_client)


def test_a_token_whose_labels_leave_out_the_roles_gets_the_agent_refused_and_ended_at_once(
    gateway_orchestrator, real_scaler, docker_client, drive_rq, monkeypatch, settings
):
    # Refused (close code 4010), the real agent neither retries nor exits: its log says so, and
    # the console ends it then, long before the registration deadline.
    orchestrator = gateway_orchestrator[0]
    real_scaler()
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    monkeypatch.setattr(kici_token, "token_labels", lambda label_set, roles: list(label_set.labels))
    agent = _ends(_scale("job-real-labels"), drive_rq, 45)
    assert agent.state == AgentState.FAILED
    reason = agent.failure_reason
    assert reason.startswith("the KiCI agent was refused by ws://"), reason
    assert (
        "which closed the connection with code 4010: "
        "Agent labels exceed token-bound scope: kici:role:builder,kici:role:init-runner; "
        "it stays up without retrying; "
    ) in reason, reason
    assert f"lists no agent {agent.agent_id}" in reason and "was last presented at" in reason, reason
    assert (agent.finished_at - agent.created_at).total_seconds() < 45
    _nothing_left(agent, orchestrator, docker_client)


def test_host_access_without_the_orchestrator_leaves_the_agent_unregistered_until_the_deadline(
    gateway_orchestrator, real_scaler, docker_client, drive_rq, settings
):
    orchestrator = gateway_orchestrator[0]
    real_scaler(networkPolicy={"hostAccess": [f"{ISOLATED_NETWORK_GATEWAY}:53"]})
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 20
    agent = _ends(_scale("job-real-host-access"), drive_rq, 60)
    assert agent.state == AgentState.FAILED
    assert agent.host_access == [f"{ISOLATED_NETWORK_GATEWAY}:53"]
    reason = agent.failure_reason
    assert "the KiCI agent did not register within 20 s with ws://" in reason, reason
    assert f"lists no agent {agent.agent_id}" in reason and "was never presented" in reason, reason
    _nothing_left(agent, orchestrator, docker_client)
