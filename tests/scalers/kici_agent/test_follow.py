"""Following a real KiCI agent (``scalers.kici_agents``): the orchestrator's list of registered
agents and the sandbox decide its state; its exit ends it at once, its silence at the deadline."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.credentials import encrypt_secret
from scalers.kici_agents import TOPOLOGY_SHARED_MS, follow_kici_agent, look_at
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
        self.log: list[str] = []

    def sandbox_exit(self, agent):
        return self.exit

    def captured_output_for(self, agent):
        return ['{"level":"error","msg":"the agent\'s last words"}']

    def agent_log_lines(self, agent):
        return self.log

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


JOB_LOG = (Path(__file__).parent / "data" / "real-agent-job.log").read_text().splitlines()
REFUSED_LOG = (Path(__file__).parent / "data" / "real-agent-refused.log").read_text().splitlines()
GREET_JOB, RUN = "58dbbfa2-00ba-44f2-aa14-524e18fa213b", "24c3da3b-a6e9-470a-acb1-d34a4545ee19"


def _through(text: str) -> list[str]:
    """The real agent's log (data/real-agent-job.log) up to its first line holding ``text``."""
    return JOB_LOG[: next(i for i, line in enumerate(JOB_LOG) if text in line) + 1]


def test_a_running_agent_shows_the_job_its_log_says_it_runs_then_idle(orchestrator, backend, admin_client):
    agent = _agent(orchestrator, state=AgentState.RUNNING)
    orchestrator.connected = [agent.agent_id]
    backend.log = _through("hello from the real agent")
    assert look_at(agent) == "running"
    agent = _reload(agent)
    assert agent.active_jobs == 1
    assert agent.backend_context == {
        "kici_token_id": "at-1",  # merged, not replaced
        "kici_activity": {"state": "busy", "jobId": GREET_JOB, "runId": RUN},
    }
    assert f"busy: job {GREET_JOB}" in admin_client.get("/agents/").content.decode()
    page = admin_client.get(f"/agents/{agent.agent_id}/").content.decode()
    assert f"busy: job <code>{GREET_JOB}</code>" in page and f"run <code>{RUN}</code>" in page

    backend.log = JOB_LOG[-3:]  # its last lines hold no marking line: what the row holds stands
    assert look_at(agent) == "running" and _reload(agent).active_jobs == 1

    backend.log = (
        _through("type=job.complete")[-5:] + _through(f'"jobId":"{GREET_JOB}","level":"info","message":"Scaler')[-1:]
    )
    assert look_at(_reload(agent)) == "running"
    agent = _reload(agent)
    assert agent.active_jobs == 0 and agent.backend_context["kici_activity"] == {
        "state": "idle",
        "jobId": "",
        "runId": "",
    }
    assert 'data-activity="idle"' in admin_client.get("/agents/").content.decode()


def test_a_connecting_agent_refused_with_4010_fails_at_once(orchestrator, backend):
    agent = _agent(orchestrator)
    backend.log = REFUSED_LOG[:-2]  # connected and authenticated, not closed yet
    assert look_at(agent) == "watching"
    backend.log = REFUSED_LOG
    assert look_at(_reload(agent)) == "refused"  # long before the deadline
    agent = _reload(agent)
    assert agent.state == AgentState.FAILED
    assert agent.failure_reason.startswith(
        f"the KiCI agent was refused by ws://127.0.0.1:{orchestrator.port}/ws, which closed the connection with code "
        "4010: Agent labels exceed token-bound scope: kici:role:builder,kici:role:init-runner; it stays up without "
        f"retrying; the orchestrator lists no agent {agent.agent_id} among those registered with it"
    ), agent.failure_reason
    assert backend.destroyed == [agent.agent_id]


def test_one_topology_answer_serves_every_agent_of_an_orchestrator_in_a_round(orchestrator, backend, monkeypatch):
    monkeypatch.setattr("scalers.kici_agents.schedule_follow", lambda agent, delay=1.0: None)
    first = _agent(orchestrator, state=AgentState.RUNNING)
    others = [make_agent(first.scaler, state=AgentState.RUNNING) for _ in range(3)]
    orchestrator.connected = [first.agent_id]

    def topology_calls() -> int:
        return sum(1 for call in orchestrator.calls if call[1] == "/admin/fleet-topology")

    for agent in [first, *others]:
        assert follow_kici_agent(agent.pk) == "running"
    assert topology_calls() == 1
    assert _reload(first).last_heartbeat and not any(_reload(agent).last_heartbeat for agent in others)
    time.sleep(TOPOLOGY_SHARED_MS / 1000 + 0.1)  # the next round asks again
    assert follow_kici_agent(first.pk) == "running"
    assert topology_calls() == 2


def test_a_change_of_activity_refreshes_the_open_pages_even_between_heartbeats(orchestrator, backend, monkeypatch):
    pushed = []
    monkeypatch.setattr("scalers.kici_agents.push_heartbeat_row", lambda agent: pushed.append(agent.active_jobs))
    agent = _agent(orchestrator, state=AgentState.RUNNING)  # not listed: no heartbeat to store
    assert look_at(agent) == "running" and pushed == []
    backend.log = _through("hello from the real agent")
    assert look_at(_reload(agent)) == "running" and pushed == [1]
    assert look_at(_reload(agent)) == "running" and pushed == [1]  # nothing new: no push
    assert _reload(agent).last_heartbeat is None
