"""A real container spawn on the private dockerd that registers with a live console records the
time of every step of its trace, and observes each once."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from agents.choices import AgentState
from agents.models import Agent
from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ensure_isolated_network
from scalers.jobs import enqueue_spawn
from scalers.lifecycle import teardown_agent
from scalers.metrics import SPAWN_STEP
from scalers.models import MetricCounter
from scalers.spawn_trace import MARKS, STEPS
from tests.support.containers import remove_test_containers
from tests.support.nft import nft_table_for
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import free_port, wsgi_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


@pytest.fixture
def nft_table(settings):
    yield from nft_table_for(settings, "ctr_kici", create=False)


@pytest.fixture(autouse=True)
def no_leftover_containers(docker_client):
    yield
    remove_test_containers(docker_client)


def test_a_real_spawn_records_every_step_from_admission_to_running(
    docker_client, agent_image, nft_table, settings, run_rq_jobs
):
    settings.ALLOWED_HOSTS = ["*"]
    ensure_isolated_network(docker_client)
    port = free_port(ISOLATED_NETWORK_GATEWAY)
    with wsgi_server(ISOLATED_NETWORK_GATEWAY, port) as url:
        agent = make_agent(make_scaler(orchestrator_url=url))
        with transaction.atomic():
            enqueue_spawn(agent)
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        deadline = time.monotonic() + 10
        while not Agent.objects.filter(pk=agent.pk, state=AgentState.RUNNING).exists():
            assert time.monotonic() < deadline, Agent.objects.get(pk=agent.pk).failure_reason
            time.sleep(0.05)
        trace = Agent.objects.get(pk=agent.pk).spawn_trace
        assert set(trace) == set(MARKS) - {"admitted"}, trace
        job_order = ["picked_up", "checked", "created", "started", "bound", "connecting"]
        assert [trace[m] for m in job_order] == sorted(trace[m] for m in job_order), trace
        assert trace["created"] <= trace["process_started"] <= trace["started"] + 0.05, trace
        assert trace["register_received"] <= trace["running"] < 10, trace
        for step in STEPS:
            buckets = MetricCounter.objects.filter(name=f"{SPAWN_STEP}_bucket", labels__step=step.value)
            assert sum(b.value for b in buckets) == 1, step
        assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")


def test_an_agent_dials_the_console_as_soon_as_its_port_is_bound(
    docker_client, agent_image, nft_table, settings, run_rq_jobs
):
    # Its first ARP for the gateway went to the guard while its port was unbound; without the
    # gateway's MAC given to it, its kernel asks again only a second later.
    settings.ALLOWED_HOSTS = ["*"]
    ensure_isolated_network(docker_client)
    port = free_port(ISOLATED_NETWORK_GATEWAY)
    with wsgi_server(ISOLATED_NETWORK_GATEWAY, port) as url:
        agent = make_agent(make_scaler(orchestrator_url=url))
        with transaction.atomic():
            enqueue_spawn(agent)
        run_rq_jobs(settings.KICI_HOST_QUEUE)
        deadline = time.monotonic() + 10
        while "running" not in Agent.objects.get(pk=agent.pk).spawn_trace:
            assert time.monotonic() < deadline, Agent.objects.get(pk=agent.pk).failure_reason
            time.sleep(0.05)
        trace = Agent.objects.get(pk=agent.pk).spawn_trace
        assert trace["register_received"] - trace["bound"] < 0.5, trace
        assert teardown_agent(Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk), "shutdown")
