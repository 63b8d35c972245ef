"""A job's own image from a real private registry (htpasswd auth): the pull is refused without
the credential and works with it, the image runs the agent injected from the runtime volume
(it has no shell of its own) which registers with a live console, and an image the registry
lacks fails the spawn naming it, with its reservation released."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.backends.base import SpawnError
from scalers.backends.container.job_runtime import AGENT_ENTRYPOINT, RUNTIME_DIR, ensure_runtime_volume
from scalers.backends.container.spawn import pull_image
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ensure_isolated_network
from scalers.credentials import encrypt_secret
from scalers.jobs import enqueue_spawn, spawn_agent
from scalers.lifecycle import teardown_agent
from scalers.models import RegistryCredential, Reservation
from tests.support.containers import remove_test_containers
from tests.support.docker import docker_client as make_docker_client
from tests.support.nft import nft_table_for
from tests.support.registry import private_registry, push_test_image
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import free_port, wsgi_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

TABLE = "ctr_kici_jobimg"


@pytest.fixture(scope="module")
def registry(dockerd):
    with private_registry() as reg:
        yield reg


@pytest.fixture(scope="module")
def job_image(registry, dockerd):
    client = make_docker_client()
    try:
        yield push_test_image(client.api, registry)
    finally:
        client.close()


@pytest.fixture
def credential(registry):
    return RegistryCredential.objects.create(
        name="test-reg", registry=registry.host, username=registry.username, secret=encrypt_secret(registry.password)
    )


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, TABLE)


@pytest.fixture(autouse=True)
def no_leftovers(docker_client, job_image):
    yield
    remove_test_containers(docker_client)
    try:
        docker_client.api.remove_image(job_image, force=True)
    except Exception:  # noqa: BLE001 - not pulled by this test
        pass


def test_the_pull_is_refused_without_the_credential_and_works_with_it(docker_client, job_image, credential, registry):
    agent = make_agent(make_scaler())
    with pytest.raises(SpawnError, match=f"pull of image {job_image} failed") as refused:
        pull_image(docker_client.api, agent, job_image)
    assert refused.value.stage == "pull"
    pull_image(docker_client.api, agent, job_image, "test-reg")
    assert docker_client.api.inspect_image(job_image)["Id"]
    docker_client.api.remove_image(job_image, force=True)

    credential.secret = encrypt_secret("not-the-password")
    credential.save()
    with pytest.raises(SpawnError, match=f"pull of image {job_image} failed") as wrong:
        pull_image(docker_client.api, agent, job_image, "test-reg")
    assert "not-the-password" not in str(wrong.value) and registry.password not in str(wrong.value)


def test_a_job_image_runs_the_injected_agent_which_registers(
    docker_client, agent_image, job_image, credential, nft_table, settings, run_rq_jobs
):
    settings.ALLOWED_HOSTS = ["*"]
    ensure_isolated_network(docker_client)
    port = free_port(ISOLATED_NETWORK_GATEWAY)
    with wsgi_server(ISOLATED_NETWORK_GATEWAY, port) as url:
        scaler = make_scaler(orchestrator_url=url, ls_config={"image": agent_image, "imagePullPolicy": "IfNotPresent"})
        agent = make_agent(scaler, job_image=job_image, job_credentials_ref="test-reg", bound_job_id="job-img-1")
        with transaction.atomic():
            enqueue_spawn(agent)
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        agent.refresh_from_db()
        assert agent.state in (AgentState.CONNECTING, AgentState.RUNNING), agent.failure_reason
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not Agent.objects.filter(pk=agent.pk, state=AgentState.RUNNING).exists():
            time.sleep(0.1)
        agent.refresh_from_db()
        logs = docker_client.api.logs(agent.managed_id).decode(errors="replace")
        assert agent.state == AgentState.RUNNING, logs

        info = docker_client.api.inspect_container(agent.managed_id)
        assert info["Config"]["Image"] == job_image
        assert info["Config"]["Entrypoint"] == AGENT_ENTRYPOINT
        runtime = [m for m in info["Mounts"] if m["Destination"] == RUNTIME_DIR]
        assert len(runtime) == 1 and runtime[0]["Type"] == "volume" and runtime[0]["RW"] is False
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        assert env["KICI_JOB_IMAGE_AGENT"] == "1" and env["KICI_RUNTIME_IMAGE"] == job_image
        assert info["Config"]["Labels"]["kici-bound-job-id"] == "job-img-1"
        assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")
    assert not Reservation.objects.filter(agent=agent).exists()


@pytest.mark.parametrize(
    ("policy", "says"), [("IfNotPresent", "pull of image {} failed"), ("Never", "image {} is not present")]
)
def test_a_job_image_the_registry_lacks_fails_the_spawn_naming_it(
    docker_client, agent_image, registry, credential, nft_table, policy, says
):
    missing = f"{registry.host}/jobs/absent:1"
    scaler = make_scaler(ls_config={"image": agent_image, "imagePullPolicy": policy})
    agent = make_agent(scaler, job_image=missing, job_credentials_ref="test-reg")
    assert spawn_agent(agent.pk) == "failed"
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED
    detail = ScalerEvent.objects.get(agent=agent, type=EventType.FAILED).detail
    assert says.format(missing) in detail, detail
    assert registry.password not in detail
    assert not Reservation.objects.filter(agent=agent).exists()
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.RELEASED).exists()
    assert not docker_client.api.containers(all=True, filters={"label": f"kici-agent-id={agent.agent_id}"})


def test_a_runtime_volume_removed_since_its_fill_is_filled_again(docker_client, agent_image):
    name = ensure_runtime_volume(docker_client.api)
    docker_client.api.remove_volume(name, force=True)
    assert ensure_runtime_volume(docker_client.api) == name
    out = docker_client.containers.run(
        agent_image, ["/bin/ls", f"{RUNTIME_DIR}/"], volumes=[f"{name}:{RUNTIME_DIR}:ro"], network_disabled=True,
        remove=True, entrypoint=[],
    )  # fmt: skip
    assert {"busybox", "sh", "wget", "kici_agent.sh"} <= set(out.decode().split())
    assert not docker_client.api.containers(all=True, filters={"label": "kici-job-runtime-fill"})
