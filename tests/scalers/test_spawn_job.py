"""The spawn job: enqueued on commit on the host queue, deadline-bounded, failure callback."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import django_rq
import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from scalers.jobs import (
    CLEANUP_GRACE_SECONDS,
    enqueue_spawn,
    schedule_watch,
    spawn_agent,
    spawn_job_failed,
    watch_registration,
)
from scalers.lifecycle import prune_stale_spawns
from scalers.models import Reservation
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(settings):
    q = django_rq.get_queue(settings.KICI_HOST_QUEUE)
    q.empty()
    yield q
    q.empty()


def test_the_spawn_is_enqueued_only_when_the_admission_commits(queue, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 120
    agent = make_agent(make_scaler())
    with transaction.atomic():
        job_id = enqueue_spawn(agent)
        assert queue.fetch_job(job_id) is None, "nothing is enqueued before the commit"
    job = queue.fetch_job(job_id)
    assert job_id == f"spawn-{agent.agent_id}" and list(job.args) == [agent.pk]
    assert job.timeout == 120 + CLEANUP_GRACE_SECONDS
    assert job.failure_callback is spawn_job_failed
    assert Agent.objects.get(pk=agent.pk).rq_job_id == job_id


def test_a_rolled_back_admission_enqueues_nothing(queue):
    agent = make_agent(make_scaler())
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            enqueue_spawn(agent)
            raise RuntimeError("admission rolled back")
    assert queue.count == 0


@pytest.fixture
def hung_runtime(tmp_path):
    """A unix socket that accepts and never answers: a runtime that hangs."""
    path = str(tmp_path / "hung.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield path
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_a_hung_runtime_cannot_hold_a_spawn_past_its_deadline(hung_runtime, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 2
    scaler = make_scaler(config={"socketPath": hung_runtime, "networkIsolation": False})
    agent = make_agent(scaler)
    t0 = time.monotonic()
    assert spawn_agent(agent.pk) == "failed"
    assert time.monotonic() - t0 < 6
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED
    assert not Reservation.objects.filter(agent=agent).exists()
    scraped = Client().get("/metrics").content.decode()
    assert f'kici_scaler_spawn_duration_seconds_count{{result="failed",scaler="{scaler.name}"}} 1.0' in scraped


def test_the_failure_callback_fails_the_agent_and_releases_it(queue):
    agent = make_agent(make_scaler(type="event", config={"provisioningTargets": ["http://127.0.0.1:9/"]}, ls_config={}))
    job = queue.enqueue(spawn_agent, agent.pk, job_id=f"spawn-{agent.agent_id}")
    spawn_job_failed(job, queue.connection, TimeoutError, TimeoutError("job exceeded its timeout"), None)
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED
    assert not Reservation.objects.filter(agent=agent).exists()
    assert ScalerEvent.objects.filter(agent=agent, type=EventType.FAILED).count() == 1


def test_a_registration_watch_is_scheduled_at_the_deadline_and_the_sweep_expires_overdue_agents(queue, settings):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    agent = make_agent(
        make_scaler(type="event", config={"provisioningTargets": ["http://127.0.0.1:9/"]}, ls_config={}),
        state=AgentState.CONNECTING,
        spawn_started_at=timezone.now(),
    )
    schedule_watch(agent, object())  # a backend without boot_failure: one look, at the deadline
    from rq.registry import ScheduledJobRegistry

    registry = ScheduledJobRegistry(queue=queue)
    (job_id,) = [i for i in registry.get_job_ids() if list(queue.fetch_job(i).args) == [agent.pk]]
    assert queue.fetch_job(job_id).func is watch_registration
    scheduled = registry.get_scheduled_time(job_id)
    assert abs((scheduled - agent.spawn_started_at).total_seconds() - 60) < 1
    assert prune_stale_spawns() == 0
    Agent.objects.filter(pk=agent.pk).update(spawn_started_at=timezone.now() - timedelta(seconds=61))
    settings.KICI_PROVISIONING_SECRET = "s"
    # the scale-down to an unreachable target fails; the expiry still fails the agent and releases it
    assert prune_stale_spawns() == 1
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED and not Reservation.objects.filter(agent=agent).exists()
    assert agent.failure_reason.startswith("agent did not register within 60 s")
