"""The spawn job returns once the backend call is done; the registration wait and the spawn slots
(``maxConcurrentSpawns``) live outside it. Host-process (bare-metal) agents that never register,
ONE real rq worker with the rq scheduler on the host queue, real PostgreSQL."""

from __future__ import annotations

import random
import stat
import threading

import django_rq
import pytest
from django.db import connection, transaction

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.admission.decide import Request
from scalers.admission.queue import AdmissionQueue
from scalers.jobs import start_waiting_spawns
from scalers.models import Reservation
from tests.support.admission import request_scale
from tests.support.concurrency import run_threads
from tests.support.scalers import make_scaler, set_global

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


@pytest.fixture
def silent_agent(tmp_path, settings):
    """A bare-metal "agent" that prints one line and never registers; an empty host queue."""
    settings.KICI_AGENT_LOG_DIR = str(tmp_path / "logs")
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


@pytest.mark.parametrize("own_transaction", [False, True], ids=["one-queue", "a-transaction-each"])
def test_an_admitted_agent_takes_its_spawn_slot_in_its_admission_transaction(monkeypatch, own_transaction):
    """Agents that fit ``maxConcurrentSpawns`` are written holding their spawn job id, so their
    start needs only the rq enqueue after the commit, not a second transaction; the rest wait."""
    enqueued = []
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": enqueued.append(agent.agent_id))

    def no_second_transaction(scaler_id):
        raise AssertionError("the slot was not taken in the admission transaction")

    monkeypatch.setattr("scalers.jobs.start_waiting_spawns", no_second_transaction)
    make_scaler(max_agents=5, max_concurrent_spawns=2)

    def ask(job_id):
        if not own_transaction:
            return request_scale(["linux"], job_id)
        with transaction.atomic():
            return request_scale(["linux"], job_id)

    decisions = [ask(f"job-{i}") for i in range(3)]
    assert [d.action for d in decisions] == ["spawning"] * 3
    agents = [_agent(d) for d in decisions]
    assert [a.rq_job_id for a in agents] == [f"spawn-{agents[0].agent_id}", f"spawn-{agents[1].agent_id}", ""]
    assert enqueued == [agents[0].agent_id, agents[1].agent_id]


def test_a_new_agent_waits_behind_older_waiting_agents_and_the_slot_goes_to_the_oldest(monkeypatch):
    enqueued = []
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": enqueued.append(agent.agent_id))
    make_scaler(max_agents=5, max_concurrent_spawns=1)
    first, second = request_scale(["linux"], "job-1"), request_scale(["linux"], "job-2")
    assert _agent(second).rq_job_id == ""
    # The first's backend call ends without the semaphore being told (a worker lost): a slot is
    # free while the second still waits. The next admission must not jump the queue.
    Agent.objects.filter(agent_id=first.agent).update(state=AgentState.CONNECTING)
    third = request_scale(["linux"], "job-3")
    assert _agent(second).rq_job_id == f"spawn-{second.agent}", "the oldest waiting agent got the slot"
    assert _agent(third).rq_job_id == ""
    assert enqueued == [first.agent, second.agent]


def test_admissions_and_freed_slots_racing_never_exceed_max_concurrent_spawns(monkeypatch):
    """Requesters on four decider connections admit while two threads end backend calls and hand
    slots on (``start_waiting_spawns``); a sampler counts the spawn jobs in flight all along."""
    limit = 3
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": None)
    set_global(max_agents=500)
    scaler = make_scaler(max_agents=500, max_concurrent_spawns=limit)
    queues = [AdmissionQueue(name=f"slots-{i}", idle_close_seconds=1) for i in range(4)]
    stop = threading.Event()
    seen = []

    def in_flight() -> int:
        return Agent.objects.filter(scaler=scaler, state=AgentState.SPAWNING).exclude(rq_job_id="").count()

    def sampler():
        try:
            while not stop.is_set():
                seen.append(in_flight())
        finally:
            connection.close()

    def finisher(seed):
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                flying = Agent.objects.filter(scaler=scaler, state=AgentState.SPAWNING).exclude(rq_job_id="")
                pk = flying.values_list("pk", flat=True).first()
                if pk is not None and rng.random() < 0.7:
                    Agent.objects.filter(pk=pk).update(state=AgentState.CONNECTING)
                start_waiting_spawns(scaler.pk)
        finally:
            connection.close()

    helpers = [threading.Thread(target=sampler)] + [threading.Thread(target=finisher, args=(i,)) for i in range(2)]
    for t in helpers:
        t.start()
    try:
        results = run_threads(
            120, lambda i: queues[i % 4].submit(Request(labels=("linux",), job_id=f"race-{i}"), timeout=60)[0]
        )
    finally:
        stop.set()
        for t in helpers:
            t.join()
        for q in queues:
            q.shutdown()
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert [d.reason for d in results if d.action != "spawning"] == []
    assert seen and max(seen) <= limit, f"in flight peaked at {max(seen)} over maxConcurrentSpawns {limit}"
    started = Agent.objects.filter(scaler=scaler).exclude(rq_job_id="").count()
    assert started > limit, "slots were handed on while admissions ran"
