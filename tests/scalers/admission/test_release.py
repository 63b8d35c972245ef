"""Every release path gives the reservation back exactly once: the
``release`` primitive, the spawn failure event, destroy (and a destroy that fails), the rq job
crashing, timing out, or dying with its worker, a spawn that never registers within its token
TTL, the stale prune, and a spawn that could not be enqueued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from unittest.mock import MagicMock, patch

import django_rq
import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.utils import timezone
from rq import Callback
from rq.registry import StartedJobRegistry

from agents.choices import AgentState, EventType
from agents.models import Agent, AgentToken, ScalerEvent
from scalers.admission.ledger import release
from scalers.lifecycle import (
    complete_job,
    drain_idle_agents,
    expire_unregistered_agents,
    fail_spawn,
    on_spawn_job_failure,
    prune_stale_spawns,
    reap_failed_spawn_jobs,
    release_agent,
    retry_stuck_teardowns,
    stale_window_seconds,
    teardown_agent,
)
from scalers.models import Reservation
from tests.support.admission import request_scale
from tests.support.concurrency import run_threads
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]


# Jobs run by the rq workers below (imported by name by the worker).
def crash_job(agent_pk: int) -> None:
    raise RuntimeError("backend exploded")


def sleepy_job(agent_pk: int, seconds: float = 30.0) -> None:
    time.sleep(seconds)


@pytest.fixture
def admitted(no_enqueue, db):
    """One admitted container agent (bare: nothing was created for it yet)."""
    make_scaler("c", max_agents=3)
    d = request_scale(["linux"], "job-1", resources={"cpus": 1})
    assert d.action == "spawning"
    return Agent.objects.select_related("scaler").get(agent_id=d.agent)


def released_events(agent) -> int:
    return ScalerEvent.objects.filter(agent=agent, type=EventType.RELEASED).count()


def test_release_is_idempotent_and_records_one_event(admitted):
    assert release(admitted.agent_id, "test") is True
    assert release(admitted.agent_id, "test") is False
    assert not Reservation.objects.exists()
    assert released_events(admitted) == 1
    ev = ScalerEvent.objects.get(agent=admitted, type=EventType.RELEASED)
    assert ev.detail == "test" and ev.payload["cpus"] == 1


def test_twenty_threads_releasing_at_once_release_once(admitted):
    results = run_threads(20, lambda i: release(admitted.agent_id, f"race-{i}"))
    assert results.count(True) == 1 and results.count(False) == 19
    assert released_events(admitted) == 1


def test_release_of_an_unknown_agent_is_false(db):
    assert release("scaler-container-00000000", "nothing") is False


def test_the_spawn_failure_event_path_releases(admitted):
    fail_spawn(admitted, RuntimeError("image missing"), reason="spawn-failed", cleaned_up=True)
    admitted.refresh_from_db()
    assert admitted.state == AgentState.FAILED
    assert not Reservation.objects.exists()


@pytest.mark.docker
def test_destroy_releases(admitted, docker_client):
    assert teardown_agent(admitted, "test-destroy") is True
    admitted.refresh_from_db()
    assert admitted.state == AgentState.DESTROYED and admitted.finished_at is not None
    assert not Reservation.objects.exists()
    assert teardown_agent(admitted, "again") is False  # idempotent


def test_a_failing_destroy_keeps_the_reservation_until_a_retry_succeeds(admitted, settings, tmp_path, docker_client):
    settings.DOCKER_HOST = f"unix://{tmp_path}/no-docker-here.sock"
    assert teardown_agent(admitted, "test-destroy") is False
    admitted.refresh_from_db()
    assert admitted.state == AgentState.DESTROYING
    assert Reservation.objects.count() == 1  # the sandbox may still run: still billed
    from tests.support.docker import DOCKER_HOST

    settings.DOCKER_HOST = DOCKER_HOST
    assert retry_stuck_teardowns(min_age_seconds=0) == 1
    assert not Reservation.objects.exists()
    # The retry keeps the cause: the timeline says why the agent ended, not only that it was retried.
    destroyed = ScalerEvent.objects.get(agent=admitted, type=EventType.DESTROYED)
    assert destroyed.payload["reason"] == "test-destroy (teardown retried)"


@pytest.mark.docker
@pytest.mark.parametrize("ending", ["job-complete", "release", "drain"])
def test_a_teardown_lost_with_its_worker_is_retried_with_its_cause_as_the_reason(admitted, docker_client, ending):
    """The orchestrator's job-complete or release, and a drain, move the agent to destroying and
    hand the teardown to a job; when that job is lost (its worker killed), the sweeper's retry
    ends the agent with the cause, not only the word retry."""
    Agent.objects.filter(pk=admitted.pk).update(state=AgentState.RUNNING, bound_job_id="job-1")
    if ending == "job-complete":
        complete_job(admitted.agent_id, "job-1")  # its teardown job is never run here
        cause = "job-complete"
    elif ending == "release":
        release_agent(admitted.agent_id, "cancelled")
        cause = "released by the orchestrator: cancelled"
    else:
        Agent.objects.filter(pk=admitted.pk).update(state=AgentState.DRAINING, active_jobs=0)
        # The drain tears down inline: its destroy fails as a killed worker's would not finish.
        dying = MagicMock(destroy=MagicMock(side_effect=RuntimeError("worker killed")))
        with patch("scalers.lifecycle.get_backend", return_value=dying):
            drain_idle_agents()
        cause = "drained"
    assert Agent.objects.get(pk=admitted.pk).state == AgentState.DESTROYING
    assert retry_stuck_teardowns(min_age_seconds=0) == 1
    destroyed = ScalerEvent.objects.get(agent=admitted, type=EventType.DESTROYED)
    assert destroyed.payload["reason"] == f"{cause} (teardown retried)"


def _enqueue(func, agent, **kw):
    q = django_rq.get_queue("default")
    return q.enqueue(func, agent.pk, on_failure=Callback(on_spawn_job_failure), **kw)


def test_an_rq_job_that_crashes_releases(admitted, run_rq_jobs, docker_client):
    job = _enqueue(crash_job, admitted)
    run_rq_jobs("default")
    assert job.get_status(refresh=True) == "failed"
    admitted.refresh_from_db()
    assert admitted.state == AgentState.FAILED and "backend exploded" in admitted.failure_reason
    assert not Reservation.objects.exists()
    assert ScalerEvent.objects.filter(agent=admitted, type=EventType.FAILED).count() == 1


def test_an_rq_job_that_times_out_releases(admitted, run_rq_jobs, docker_client):
    _enqueue(sleepy_job, admitted, job_timeout=1)
    run_rq_jobs("default")
    admitted.refresh_from_db()
    assert admitted.state == AgentState.FAILED and "JobTimeoutException" in admitted.failure_reason
    assert not Reservation.objects.exists()


def test_a_killed_worker_releases_through_rq_abandoned_job_cleanup(admitted, docker_client):
    """A real forking rq worker runs the job; it is SIGKILLed mid-job; rq's started-registry
    cleanup finds the job abandoned and calls the failure callback."""
    job = _enqueue(sleepy_job, admitted)
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kici_site.settings_test",
        "DATABASE_URL": (
            f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        "REDIS_URL": django_settings.REDIS_URL,
    }
    root = Path(__file__).resolve().parents[3]
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "rqworker", "default", "--burst"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while job.get_status(refresh=True) != "started":
            assert time.monotonic() < deadline, "the worker never started the job"
            assert worker.poll() is None, "the worker exited early"
            time.sleep(0.1)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    assert Reservation.objects.count() == 1  # nothing ran the callback yet
    registry = StartedJobRegistry(queue=django_rq.get_queue("default"))
    registry.cleanup(timestamp=time.time() + 100_000)
    admitted.refresh_from_db()
    assert admitted.state == AgentState.FAILED and "AbandonedJobError" in admitted.failure_reason
    assert not Reservation.objects.exists()


def test_the_sweep_fails_spawns_whose_rq_job_failed(admitted, docker_client):
    q = django_rq.get_queue("default")
    job = q.enqueue(crash_job, admitted.pk)  # no failure callback: only the sweep can notice
    from rq import SimpleWorker

    SimpleWorker([q], connection=q.connection, serializer=django_settings.KICI_JOB_SERIALIZER).work(burst=True)
    assert job.get_status(refresh=True) == "failed"
    Agent.objects.filter(pk=admitted.pk).update(rq_job_id=job.id)
    assert reap_failed_spawn_jobs(min_age_seconds=0) == 1
    assert not Reservation.objects.exists()
    admitted.refresh_from_db()
    assert admitted.failure_reason == f"spawn job {job.id} is failed: RuntimeError: backend exploded"


@pytest.mark.parametrize("loss", ["evicted", "queue-emptied"])
def test_a_spawn_whose_rq_job_is_gone_is_failed_and_released_within_one_round(admitted, loss, docker_client):
    """Redis lost the spawn job (an eviction, a restart without its data, another client emptying
    the queue): the next round fails the agent naming the loss and frees its slot, instead of
    the token TTL an hour later. While the job is queued, nothing is judged."""
    queue = django_rq.get_queue("default")
    job = queue.enqueue(sleepy_job, admitted.pk, job_id=f"spawn-{admitted.agent_id}")
    Agent.objects.filter(pk=admitted.pk).update(rq_job_id=job.id)
    assert reap_failed_spawn_jobs(min_age_seconds=0) == 0
    assert Reservation.objects.filter(agent=admitted).exists()
    if loss == "evicted":
        django_rq.get_connection("default").delete(job.key)
    else:
        queue.empty()
    assert reap_failed_spawn_jobs(min_age_seconds=0) == 1
    admitted.refresh_from_db()
    assert admitted.state == AgentState.FAILED
    assert admitted.failure_reason.startswith(f"its spawn job {job.id} is gone from Redis")
    assert not Reservation.objects.exists()
    released = ScalerEvent.objects.get(agent=admitted, type=EventType.RELEASED)
    assert released.detail == "spawn-job-lost"


def test_a_spawn_job_id_set_a_moment_ago_is_not_judged_yet(admitted):
    """A job is enqueued when its admission commits: a fresh job id with no job yet is not lost."""
    Agent.objects.filter(pk=admitted.pk).update(rq_job_id=f"spawn-{admitted.agent_id}", updated_at=timezone.now())
    assert reap_failed_spawn_jobs(min_age_seconds=10) == 0
    assert Agent.objects.get(pk=admitted.pk).state == AgentState.SPAWNING


def test_an_agent_that_never_registers_within_its_token_ttl_is_released(admitted, settings, docker_client):
    settings.KICI_AGENT_TOKEN_TTL_SECONDS = 60
    assert expire_unregistered_agents() == 0
    Agent.objects.filter(pk=admitted.pk).update(created_at=timezone.now() - timedelta(seconds=61))
    assert expire_unregistered_agents() == 1
    admitted.refresh_from_db()
    assert admitted.state == AgentState.FAILED and "token TTL" in admitted.failure_reason
    assert not Reservation.objects.exists()


def test_an_agent_whose_tokens_all_expired_unused_is_released(admitted, docker_client):
    AgentToken.objects.create(agent=admitted, token_hash="a" * 64, expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_unregistered_agents() == 1
    assert not Reservation.objects.exists()


def test_a_registered_agent_is_never_expired(admitted):
    Agent.objects.filter(pk=admitted.pk).update(
        state=AgentState.RUNNING, registered_at=timezone.now(), created_at=timezone.now() - timedelta(days=2)
    )
    assert expire_unregistered_agents() == 0
    assert Reservation.objects.count() == 1


@pytest.mark.parametrize(("timeout", "window"), [(60, 300), (600, 600)])
def test_the_stale_prune_window_is_at_least_five_minutes(settings, timeout, window):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = timeout
    assert stale_window_seconds() == window


def test_the_stale_prune_releases_old_spawns_but_never_queued_ones(admitted, settings, docker_client):
    settings.KICI_SPAWN_TIMEOUT_SECONDS = 60
    queued = request_scale(["linux"], "job-2")
    Agent.objects.filter(agent_id=queued.agent).update(created_at=timezone.now() - timedelta(hours=1))  # never started
    Agent.objects.filter(pk=admitted.pk).update(spawn_started_at=timezone.now() - timedelta(seconds=299))
    assert prune_stale_spawns() == 0
    Agent.objects.filter(pk=admitted.pk).update(spawn_started_at=timezone.now() - timedelta(seconds=301))
    assert prune_stale_spawns() == 1
    assert list(Reservation.objects.values_list("agent__agent_id", flat=True)) == [queued.agent]


def test_a_spawn_that_cannot_be_enqueued_is_released(monkeypatch, db, docker_client):
    def broken(agent, host=""):
        raise ConnectionError("redis is down")

    monkeypatch.setattr("scalers.jobs.enqueue_spawn", broken)
    make_scaler("c", max_agents=3)
    d = request_scale(["linux"], "job-1")
    assert d.action == "skipped" and "redis is down" in d.reason
    assert not Reservation.objects.exists()
    assert Agent.objects.get().state == AgentState.FAILED


def test_a_release_frees_the_slot_for_the_next_request_at_once(admitted):
    assert [request_scale(["linux"], f"job-{i}").action for i in (2, 3, 4)] == ["spawning", "spawning", "at-capacity"]
    assert release(admitted.agent_id, "x") is True
    Agent.objects.filter(pk=admitted.pk).update(state=AgentState.DESTROYED)
    assert request_scale(["linux"], "job-5").action == "spawning"


def test_a_release_rolled_back_with_its_transaction_keeps_the_reservation(admitted):
    with pytest.raises(RuntimeError), transaction.atomic():
        assert release(admitted.agent_id, "x") is True
        raise RuntimeError("rolled back")
    assert Reservation.objects.filter(agent=admitted).exists()
    assert released_events(admitted) == 0
    assert release(admitted.agent_id, "x") is True
