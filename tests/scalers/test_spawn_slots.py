"""The spawn job returns once the backend call is done; the registration wait and the spawn slots
(``maxConcurrentSpawns``) live outside it. Host-process (bare-metal) agents that never register,
ONE real rq worker with the rq scheduler on the host queue, real PostgreSQL."""

from __future__ import annotations

import stat

import django_rq
import pytest

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.admission.service import request_scale
from scalers.models import Reservation
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


@pytest.fixture
def silent_agent(tmp_path, settings):
    """A bare-metal "agent" that prints one line and never registers; an empty host queue."""
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
    settings.KICI_ADMISSION_BATCHING = False
    path = tmp_path / "silent"
    path.write_text("#!/bin/sh\necho silent agent up\nexec sleep 60\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    queue = django_rq.get_queue(settings.KICI_HOST_QUEUE)
    queue.empty()
    yield str(path)
    for agent in Agent.objects.select_related("scaler").exclude(state__in=[AgentState.FAILED, AgentState.DESTROYED]):
        from scalers.lifecycle import teardown_agent

        teardown_agent(agent, "test over")
    queue.empty()


def _agent(decision) -> Agent:
    return Agent.objects.get(agent_id=decision.agent)


def test_with_max_concurrent_spawns_1_the_second_spawn_starts_when_the_first_backend_call_ends(
    silent_agent, settings, drive_rq
):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    make_scaler(type="bare-metal", max_agents=4, max_concurrent_spawns=1, ls_config={"binaryPath": silent_agent})
    first, second = request_scale(["linux"], "job-1"), request_scale(["linux"], "job-2")
    assert (first.action, second.action) == ("spawning", "spawning"), "over the cap waits, it is not refused"
    assert _agent(second).rq_job_id == "", "no spawn slot yet"
    assert django_rq.get_queue(settings.KICI_HOST_QUEUE).count == 1

    assert drive_rq(lambda: _agent(second).state == AgentState.CONNECTING, 10)
    a, b = _agent(first), _agent(second)
    assert a.state == AgentState.CONNECTING and a.registered_at is None, "the first never registered"
    connected = ScalerEvent.objects.get(agent=a, type=EventType.CONNECTING).created_at
    assert b.spawn_started_at >= connected, "the slot freed when the first backend call ended"


def test_an_agent_that_never_registers_fails_at_its_deadline_and_frees_its_slot(silent_agent, settings, drive_rq):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 2
    make_scaler(type="bare-metal", max_agents=1, ls_config={"binaryPath": silent_agent})
    first = request_scale(["linux"], "job-1")
    assert request_scale(["linux"], "job-2").action == "at-capacity"

    assert drive_rq(lambda: _agent(first).state == AgentState.FAILED, 10)
    agent = _agent(first)
    assert agent.failure_reason.startswith("agent did not register within 2 s")
    assert "--- captured output ---\nsilent agent up" in agent.failure_reason
    assert ScalerEvent.objects.get(agent=agent, type=EventType.RELEASED).detail == "spawn-timeout"
    assert not Reservation.objects.filter(agent=agent).exists()
    assert request_scale(["linux"], "job-3").action == "spawning", "its slot is free again"
