"""Warm pools: deficit pass under the admission lock, idle reaping through
mark_draining, consumption by jobs, and the gauges on /metrics."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers.admission.matching import WORLD_CACHE
from scalers.lifecycle import clear_draining, mark_draining
from scalers.models import LabelSet, Reservation, Scaler
from scalers.warm_pool_config import configured_pools, pool_status, read_world
from scalers.warm_pools import WarmPools, deficit_pass, idle_check
from tests.support.admission import request_scale
from tests.support.concurrency import run_threads
from tests.support.scalers import make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]

GiB = 1024**3
SHAPE = {"resources": {"cpus": 2, "memory": "4g"}}


def warm_scaler(size=3, max_agents=10, label_sets=(("linux", "docker"),), **kw):
    return make_scaler("w", max_agents=max_agents, label_sets=label_sets, warm_size=size, ls_config=SHAPE, **kw)


#: Serial numbers of the warm agents the tests create (unique agent ids across tests).
_WARM_IDS = itertools.count(1)


def warm_agent(scaler, index=0, *, state=AgentState.RUNNING, idle_seconds=0.0, cpus=2.0, memory=4 * GiB):
    n = next(_WARM_IDS)
    ls = LabelSet.objects.get(scaler=scaler, index=index)
    agent = Agent.objects.create(
        agent_id=f"scaler-container-w{n:07x}",
        scaler=scaler,
        label_set=ls,
        state=state,
        warm=True,
        owner_instance="t",
        labels=ls.labels,
        registered_at=(timezone.now() - timedelta(seconds=idle_seconds)) if state == AgentState.RUNNING else None,
    )
    Reservation.objects.create(
        scaler=scaler,
        agent=agent,
        cpus=cpus,
        memory_bytes=memory,
        limit_cpus=cpus,
        limit_memory_bytes=memory,
        owner_instance="t",
    )
    return agent


def warm_counts(scaler):
    qs = Agent.objects.filter(scaler=scaler, warm=True)
    return qs.filter(state=AgentState.RUNNING).count(), qs.filter(state=AgentState.SPAWNING).count()


def test_the_deficit_pass_fills_size_minus_ready_minus_in_flight():
    s = warm_scaler(size=3)
    warm_agent(s)
    assert deficit_pass() == 2
    assert warm_counts(s) == (1, 2)
    spawned = Agent.objects.filter(scaler=s, state=AgentState.SPAWNING)
    assert all(a.warm and a.bound_job_id == "" for a in spawned)
    assert {(r.cpus, r.memory_bytes) for r in Reservation.objects.filter(agent__in=spawned)} == {(2.0, 4 * GiB)}
    assert deficit_pass() == 0  # in flight counts


def test_a_connecting_warm_agent_is_in_flight_until_it_registers():
    s = warm_scaler(size=2)
    warm_agent(s, state=AgentState.CONNECTING)  # its backend call is done, it has not registered
    assert [(p.ready, p.in_flight) for p in pool_status()] == [(0, 1)]
    assert deficit_pass() == 1, "the connecting agent is not spawned again"


def test_the_headroom_is_shared_across_the_pass():
    s = warm_scaler(size=3, max_agents=4, label_sets=[["linux", "a"], ["linux", "b"]])
    assert deficit_pass() == 4
    per_set = sorted(Agent.objects.filter(scaler=s).values_list("label_set__index", flat=True))
    assert per_set == [0, 0, 0, 1]


def test_no_headroom_no_spawn():
    set_global(max_agents=2)
    warm_scaler(size=3)
    make_scaler("busy", max_agents=5, label_sets=[["busy"]])
    request_scale(["busy"], "j1")
    request_scale(["busy"], "j2")
    assert deficit_pass() == 0


def test_warm_agents_count_toward_every_cap():
    warm_scaler(size=3, max_agents=3)
    assert deficit_pass() == 3
    d = request_scale(["linux", "docker"], "job-1", resources={"cpus": 8})  # no warm agent fits, spawn refused
    assert (d.action, d.cap) == ("at-capacity", "maxAgents")


def test_a_refused_warm_spawn_is_not_in_flight_and_the_next_tick_retries():
    # the resource cap refuses the warm spawns; once it is raised, the next pass fills.
    s = warm_scaler(size=2, cpu=1)
    assert deficit_pass() == 0
    assert warm_counts(s) == (0, 0)
    Scaler.objects.filter(pk=s.pk).update(max_cpu=10)
    assert deficit_pass() == 2


def test_a_failed_warm_spawn_frees_its_in_flight_slot():
    s = warm_scaler(size=1)
    assert deficit_pass() == 1
    Agent.objects.filter(scaler=s).update(state=AgentState.FAILED)
    Reservation.objects.all().delete()
    assert deficit_pass() == 1


def test_concurrent_deficit_passes_never_overshoot():
    s = warm_scaler(size=5, max_agents=50)
    results = run_threads(12, lambda i: deficit_pass())
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(results) == 5
    assert warm_counts(s) == (0, 5)


@pytest.mark.parametrize(
    ("size", "ages", "destroyed"),
    [
        (2, [600, 360, 60], [600]),  # only the oldest of the excess, and only if idle too long
        (2, [3600, 3600], []),  # never reaps at or below the target
        (0, [600, 60], [600]),  # size 0 drains, still honouring the idle timeout
    ],
)
def test_the_idle_check_reaps_only_old_surplus(size, ages, destroyed, docker_client):
    s = warm_scaler(size=size, warm_idle_timeout=300)
    agents = {age: warm_agent(s, idle_seconds=age) for age in ages}
    idle_check()
    gone = sorted(age for age, a in agents.items() if Agent.objects.get(pk=a.pk).state == AgentState.DESTROYED)
    assert gone == sorted(destroyed)
    assert Reservation.objects.count() == len(ages) - len(destroyed)


def test_a_removed_pool_loses_all_its_idle_agents(docker_client):
    # a removed pool
    s = warm_scaler(size=2)
    warm_agent(s, idle_seconds=10)
    warm_agent(s, idle_seconds=20)
    Scaler.objects.filter(pk=s.pk).update(warm_pool_enabled=False)
    assert idle_check() == 2
    assert not Reservation.objects.exists()


def test_a_shrunk_pool_loses_its_oldest_surplus_at_once_after_a_config_change(docker_client):
    # a pool shrunk 5 -> 2 with 4 idle
    s = warm_scaler(size=5)
    ages = [40, 30, 20, 10]
    agents = [warm_agent(s, idle_seconds=a) for a in ages]
    pools = WarmPools()
    pools.started = True
    pools.tick(force=True)  # remembers the config version; fills the pool to 5
    Scaler.objects.filter(pk=s.pk).update(warm_pool_size=2, updated_at=timezone.now())
    WORLD_CACHE.clear()
    pools.tick(force=True)
    states = [Agent.objects.get(pk=a.pk).state for a in agents]
    assert states == [AgentState.DESTROYED, AgentState.DESTROYED, AgentState.RUNNING, AgentState.RUNNING]


def test_pools_without_a_shape_or_with_a_bad_memory_string_are_not_configured():
    make_scaler("none", warm_size=2, label_sets=[["a"]])
    make_scaler("bad", warm_size=2, label_sets=[["b"]], ls_config={"resources": {"memory": "4Gi"}})
    make_scaler("good", warm_size=2, label_sets=[["c"]], ls_config=SHAPE)
    pools, warnings = configured_pools(read_world())
    assert [p.scaler_name for p in pools] == ["good"]
    assert any("none" in w and "declare" in w for w in warnings)
    assert any("bad" in w and "Invalid memory format" in w for w in warnings)


def test_defaults_alone_give_a_pool_its_shape():
    set_global(defaults={"limits": {"cpus": 1}})
    make_scaler("d", warm_size=1, label_sets=[["a"]])
    assert [p.scaler_name for p in configured_pools(read_world())[0]] == ["d"]


def test_a_warm_agent_with_a_job_is_not_destroyed(docker_client):
    s = warm_scaler(size=0)
    agent = warm_agent(s, idle_seconds=3600)
    Agent.objects.filter(pk=agent.pk).update(active_jobs=1)
    assert mark_draining(agent.agent_id) == 1
    clear_draining(agent.agent_id)
    assert Agent.objects.get(pk=agent.pk).state == AgentState.RUNNING
    Agent.objects.filter(pk=agent.pk).update(active_jobs=0)
    assert mark_draining(agent.agent_id) == 0
    assert Agent.objects.get(pk=agent.pk).state == AgentState.DRAINING
    assert mark_draining("scaler-container-unknown") is None


@pytest.mark.parametrize(
    ("resources", "assigned"),
    [
        ({"requests": {"cpus": 2}}, True),
        ({"requests": {"cpus": 4}}, False),
        ({"limits": {"memory": "2g"}}, False),
        ({"requests": {"cpus": 2}, "limits": {"cpus": 3}}, False),
        (None, True),
    ],
)
def test_a_job_consumes_an_idle_warm_agent_that_fits(resources, assigned):
    s = warm_scaler(size=1)
    agent = warm_agent(s, idle_seconds=5)
    d = request_scale(["linux", "docker"], "job-1", resources=resources)
    if assigned:
        assert (d.action, d.agent) == ("assigned", agent.agent_id)
        assert Agent.objects.get(pk=agent.pk).bound_job_id == "job-1"
        assert Reservation.objects.count() == 1
    else:
        assert d.action == "spawning" and d.agent != agent.agent_id
        assert Agent.objects.get(pk=agent.pk).bound_job_id == ""


def test_a_job_with_its_own_image_never_takes_a_warm_agent():
    s = warm_scaler(size=1)
    warm_agent(s)
    assert request_scale(["linux", "docker"], "job-1", job_image={"image": "custom:1"}).action == "spawning"


def test_a_draining_warm_agent_is_not_assigned():
    s = warm_scaler(size=1)
    agent = warm_agent(s)
    mark_draining(agent.agent_id)
    assert request_scale(["linux", "docker"], "job-1").action == "spawning"


def test_the_api_answers_200_with_the_consumed_warm_agent(settings):
    settings.KICI_API_TOKEN = "t"
    s = warm_scaler(size=1)
    agent = warm_agent(s)
    r = Client().post(
        "/api/v1/scale",
        data={"labels": ["linux"], "jobId": "j"},
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer t",
    )
    assert r.status_code == 200 and r.json()["agentId"] == agent.agent_id and r.json()["warm"] is True


def test_start_runs_the_first_tick_immediately_and_gauges_show_the_pool():
    s = warm_scaler(size=2)
    warm_agent(s)
    before = pool_status()
    assert [(p.scaler, p.label_set, p.target, p.ready, p.in_flight) for p in before] == [("w", "docker,linux", 2, 1, 0)]
    pools = WarmPools()
    pools.start()
    assert warm_counts(s) == (1, 1)
    body = Client().get("/metrics").content.decode()
    assert 'kici_orch_scaler_warm_pool_target{label_set="docker,linux",scaler="w"} 2.0' in body
    assert 'kici_orch_scaler_warm_pool_ready{label_set="docker,linux",scaler="w"} 1.0' in body
    assert 'kici_orch_scaler_warm_pool_in_flight{label_set="docker,linux",scaler="w"} 1.0' in body
    assert 'kici_orch_scaler_warm_pool_spawns_total{scaler="w"} 1.0' in body
