"""Following a real KiCI agent (``scalers.kici_agents``): the orchestrator's list of registered
agents and the sandbox decide its state; its exit ends it at once, its silence at the deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.credentials import encrypt_secret
from scalers.kici_agents import follow_kici_agent, look_at
from scalers.models import OrchestratorAdminToken, Reservation
from tests.support.kici_stand_in import ADMIN_TOKEN, stand_in_orchestrator
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


class FakeBackend:
    """A container backend's answers about one sandbox: ``exit`` None while it runs."""

    def __init__(self):
        self.exit: str | None = None
        self.destroyed: list[str] = []
        self.registered: list[str] = []

    def sandbox_exit(self, agent):
        return self.exit

    def captured_output_for(self, agent):
        return ['{"level":"error","msg":"the agent\'s last words"}']

    def sandbox_registered(self, agent):
        self.registered.append(agent.agent_id)

    def destroy(self, agent, reason="shutdown"):
        self.destroyed.append(agent.agent_id)


@pytest.fixture
def orchestrator():
    with stand_in_orchestrator() as state:
        OrchestratorAdminToken.objects.create(name="orch", secret=encrypt_secret(ADMIN_TOKEN))
        yield state


@pytest.fixture
def backend(monkeypatch):
    fake = FakeBackend()
    monkeypatch.setattr("scalers.kici_agents.get_backend", lambda scaler: fake)
    monkeypatch.setattr("scalers.lifecycle.get_backend", lambda scaler: fake)
    return fake


def _agent(orchestrator, state=AgentState.CONNECTING, **fields):
    scaler = make_scaler(
        labels=("real-linux",),
        ls_config={
            "image": "kici-real-agent:test",
            "kiciAgent": {"orchestratorUrl": f"ws://127.0.0.1:{orchestrator.port}/ws", "adminTokenRef": "orch"},
        },
    )
    orchestrator.tokens["at-1"] = {"id": "at-1", "labels": ["real-linux"], "lastSeenAt": None}
    return make_agent(
        scaler,
        state=state,
        managed_id="c0ffee",
        spawn_started_at=timezone.now(),
        backend_context={"kici_token_id": "at-1"},
        **fields,
    )


def _reload(agent) -> Agent:
    return Agent.objects.select_related("scaler", "label_set").get(pk=agent.pk)


def test_a_connecting_agent_the_orchestrator_lists_is_running(orchestrator, backend):
    agent = _agent(orchestrator)
    assert look_at(agent) == "watching"
    assert backend.registered == []
    orchestrator.connected = [agent.agent_id]
    assert look_at(_reload(agent)) == "running"
    agent = _reload(agent)
    assert agent.state == AgentState.RUNNING and agent.registered_at and agent.last_heartbeat
    assert backend.registered == [agent.agent_id]  # told once, when it registered
    assert look_at(agent) == "running" and backend.registered == [agent.agent_id]
    event = ScalerEvent.objects.get(agent=agent, type=EventType.REGISTERED)
    assert event.detail == f"the KiCI agent registered with ws://127.0.0.1:{orchestrator.port}/ws"


def test_an_agent_that_exits_before_registering_fails_with_the_orchestrators_answer(orchestrator, backend):
    agent = _agent(orchestrator)
    backend.exit = "exited with code 1"
    assert look_at(agent) == "failed"
    agent = _reload(agent)
    assert agent.state == AgentState.FAILED
    assert agent.failure_reason.startswith(
        f"the KiCI agent exited with code 1 without registering with ws://127.0.0.1:{orchestrator.port}/ws; "
        f"the orchestrator lists no agent {agent.agent_id} among those registered with it; "
        "its token at-1 was never presented"
    ), agent.failure_reason
    failed = ScalerEvent.objects.get(agent=agent, type=EventType.FAILED)
    assert "the agent's last words" in str(failed.payload) + failed.detail
    assert backend.destroyed == [agent.agent_id]
    assert not Reservation.objects.filter(agent=agent).exists()


def test_an_agent_still_unlisted_at_the_deadline_expires(orchestrator, backend, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 30
    agent = _agent(orchestrator)
    Agent.objects.filter(pk=agent.pk).update(spawn_started_at=timezone.now() - timedelta(seconds=31))
    assert look_at(_reload(agent)) == "expired"
    agent = _reload(agent)
    assert agent.state == AgentState.FAILED
    reason = agent.failure_reason
    assert reason.startswith("the KiCI agent did not register within 30 s with ws://"), reason
    assert "its token at-1 was never presented" in agent.failure_reason


def test_an_unreachable_orchestrator_is_named_in_the_failure(orchestrator, backend):
    agent = _agent(orchestrator)
    OrchestratorAdminToken.objects.all().delete()
    backend.exit = "exited with code 1"
    assert look_at(agent) == "failed"
    assert "the orchestrator could not be asked (no orchestrator admin token named 'orch'" in (
        _reload(agent).failure_reason
    )


def test_a_running_agent_that_exits_is_destroyed_and_its_slot_freed_at_once(orchestrator, backend):
    agent = _agent(orchestrator, state=AgentState.RUNNING)
    orchestrator.connected = [agent.agent_id]
    before = timezone.now()
    assert look_at(agent) == "running"
    assert _reload(agent).last_heartbeat >= before
    orchestrator.connected = []
    backend.exit = "exited with code 0"
    assert look_at(_reload(agent)) == "destroyed"
    agent = _reload(agent)
    assert agent.state == AgentState.DESTROYED
    assert agent.teardown_reason == "the KiCI agent exited with code 0 (it shuts down once idle)"
    assert backend.destroyed == [agent.agent_id]
    assert not Reservation.objects.filter(agent=agent).exists()
    assert follow_kici_agent(agent.pk) == "over"


def test_the_follow_job_schedules_itself_while_the_agent_lives(orchestrator, backend, monkeypatch):
    scheduled = []
    monkeypatch.setattr("scalers.kici_agents.schedule_follow", lambda agent, delay=1.0: scheduled.append(agent.pk))
    agent = _agent(orchestrator)
    assert follow_kici_agent(agent.pk) == "watching"
    backend.exit = "exited with code 3"
    assert follow_kici_agent(agent.pk) == "failed"
    assert scheduled == [agent.pk]


def test_the_sweeper_resumes_a_lost_follow_once(orchestrator, backend, monkeypatch):
    from scalers.hosts import scaler_queue
    from scalers.kici_agents import resume_follows

    scheduled = []
    agent = _agent(orchestrator, state=AgentState.RUNNING)
    make_agent(make_scaler(labels=("plain",)), state=AgentState.RUNNING)  # the console's own agent
    connection = scaler_queue(agent.scaler).connection
    connection.delete(f"kici:follow:{agent.pk}")
    monkeypatch.setattr("scalers.kici_agents.scaler_queue", lambda scaler: FakeQueue(connection, scheduled))
    assert resume_follows() == 1
    assert resume_follows() == 0  # its follow is marked alive now
    assert scheduled == [agent.pk]


class FakeQueue:
    """A queue that records what is scheduled on it, on the real Redis connection."""

    def __init__(self, connection, scheduled):
        self.connection, self.scheduled = connection, scheduled

    def enqueue_in(self, delay, func, agent_pk, **kwargs):
        self.scheduled.append(agent_pk)


def test_scheduling_a_follow_marks_it_alive_and_queues_it(orchestrator):
    from rq.registry import ScheduledJobRegistry

    from scalers.hosts import scaler_queue
    from scalers.kici_agents import FOLLOW_LOST_SECONDS, schedule_follow

    agent = _agent(orchestrator)
    queue = scaler_queue(agent.scaler)
    registry = ScheduledJobRegistry(queue=queue)
    before = set(registry.get_job_ids())
    schedule_follow(agent)
    assert 0 < queue.connection.ttl(f"kici:follow:{agent.pk}") <= FOLLOW_LOST_SECONDS
    [job_id] = set(registry.get_job_ids()) - before
    job = queue.fetch_job(job_id)
    assert job.func_name == "scalers.kici_agents.follow_kici_agent" and list(job.args) == [agent.pk]
    registry.remove(job_id, delete_job=True)
