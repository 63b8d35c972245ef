"""Recovery on boot and on leader change, leader election with a
PostgreSQL advisory lock, and the sweeper command that runs both."""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta

import django_rq
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rq import Queue, SimpleWorker

from agents.choices import AgentState, EventType
from agents.models import Agent, ScalerEvent
from agents.tokens import TokenRejected, mint_registration_token, redeem_registration_token
from scalers.leader import DEAD_PEER_SECONDS, KEEPALIVE_COUNT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, Leadership
from scalers.models import RecoveryReport, Reservation
from scalers.recovery import ENQUEUE_GRACE_SECONDS, recover_state
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]

ME = "console-a"
OTHER = "console-b"
GiB = 1024**3


def seed_agent(scaler, *, state=AgentState.SPAWNING, owner=ME, cpus=0.0, memory=0, reservation=True, **fields):
    n = Agent.objects.count()
    agent = Agent.objects.create(
        agent_id=f"scaler-{scaler.type}-{n:08x}", scaler=scaler, state=state, owner_instance=owner, **fields
    )
    if reservation:
        Reservation.objects.create(scaler=scaler, agent=agent, cpus=cpus, memory_bytes=memory, owner_instance=owner)
    return agent


def counts(r):
    return (r.spawning_agents_rehydrated, r.spawning_dropped, r.reservations_rehydrated, r.reservations_dropped)


@pytest.mark.docker
def test_a_local_spawn_is_destroyed_then_failed_and_released(docker_client):
    agent = seed_agent(make_scaler("c", type="container"))
    token = mint_registration_token(agent)
    r = recover_state(ME, spawn_alive=lambda a: False)
    assert counts(r) == (0, 1, 0, 0)  # its reservation went with its teardown, not as an unbacked one
    agent.refresh_from_db()
    assert agent.state == AgentState.FAILED and "does not survive" in agent.failure_reason
    assert not Reservation.objects.exists()
    assert [e.detail for e in ScalerEvent.objects.filter(agent=agent, type=EventType.RELEASED)] == ["recovery"]
    with pytest.raises(TokenRejected):
        redeem_registration_token(token)


def test_a_dropped_spawn_whose_sandbox_cannot_be_destroyed_keeps_its_slot(settings, tmp_path):
    # The spawn may have started its container: until the destroy succeeds it stays billed.
    settings.DOCKER_HOST = f"unix://{tmp_path}/no-docker-here.sock"
    agent = seed_agent(make_scaler("c", type="container"))
    token = mint_registration_token(agent)
    assert recover_state(ME, spawn_alive=lambda a: False).spawning_dropped == 1
    agent.refresh_from_db()
    assert agent.state == AgentState.DESTROYING and "does not survive" in agent.failure_reason
    assert Reservation.objects.filter(agent=agent).exists()
    with pytest.raises(TokenRejected):  # no registration for a spawn given up
        redeem_registration_token(token)


@pytest.mark.parametrize("kind", ["container", "firecracker", "bare-metal"])
def test_every_local_backend_type_is_dropped(kind):
    seed_agent(make_scaler("s", type=kind))
    assert recover_state(ME, spawn_alive=lambda a: False).spawning_dropped == 1


def test_an_event_spawn_is_rehydrated_and_its_prune_clock_starts_at_spawned_at():
    scaler = make_scaler("ev", type="event", config={"provisioningTargets": ["wf"]})
    agent = seed_agent(scaler, cpus=2, memory=4 * GiB)
    Agent.objects.filter(pk=agent.pk).update(created_at=timezone.now() - timedelta(minutes=3))
    r = recover_state(ME)
    assert counts(r) == (1, 0, 1, 0)
    agent.refresh_from_db()
    assert agent.state == AgentState.SPAWNING
    assert agent.spawn_started_at == agent.created_at
    res = Reservation.objects.get()
    assert (res.cpus, res.memory_bytes) == (2, 4 * GiB)


def test_a_reservation_no_spawn_backs_is_dropped():
    # the agent is gone (failed) but its reservation row survived.
    seed_agent(make_scaler("c"), state=AgentState.FAILED)
    r = recover_state(ME)
    assert counts(r) == (0, 0, 0, 1)
    assert not Reservation.objects.exists()


def test_rows_of_another_instance_are_untouched_and_uncounted():
    scaler = make_scaler("c")
    seed_agent(scaler, owner=OTHER)
    seed_agent(scaler, owner=OTHER, state=AgentState.FAILED)
    r = recover_state(ME, spawn_alive=lambda a: False)
    assert counts(r) == (0, 0, 0, 0)
    assert Reservation.objects.count() == 2
    assert Agent.objects.filter(state=AgentState.SPAWNING).count() == 1


def test_a_running_agent_keeps_its_reservation():
    seed_agent(make_scaler("c"), state=AgentState.RUNNING, bound_job_id="job-1", registered_at=timezone.now())
    r = recover_state(ME)
    assert counts(r) == (0, 0, 1, 0)
    assert r.agent_jobs_rehydrated == 1


def test_a_local_spawn_whose_rq_job_still_runs_is_kept():
    seed_agent(make_scaler("c"))
    r = recover_state(ME, spawn_alive=lambda a: True)
    assert counts(r) == (1, 0, 1, 0)


def test_a_spawn_whose_job_finished_while_recovery_looked_keeps_its_agent_and_slot():
    # Recovery read the agent spawning; before it asked rq, the worker's spawn job moved the agent
    # to connecting (its process runs, it will register) and finished, so rq no longer calls the
    # job alive. The agent was spawned, not lost: it stays connecting with its reservation.
    scaler = make_scaler("b", type="bare-metal", ls_config={"binaryPath": "/bin/true"})
    agent = seed_agent(scaler, rq_job_id="spawn-done")

    def finished_meanwhile(seen: Agent) -> bool:
        def worker():
            Agent.objects.filter(pk=seen.pk).update(state=AgentState.CONNECTING, managed_id="4242")
            connection.close()

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        return False

    r = recover_state(ME, spawn_alive=finished_meanwhile)
    agent.refresh_from_db()
    assert (agent.state, agent.failure_reason) == (AgentState.CONNECTING, "")
    assert counts(r) == (1, 0, 1, 0)
    assert Reservation.objects.filter(agent=agent).exists()


def test_a_local_spawn_whose_rq_job_rq_does_not_know_is_dropped_by_the_default_check():
    agent = seed_agent(make_scaler("c"), rq_job_id="spawn-gone")  # its job is lost: nothing can be running it
    claimed = timezone.now() - timedelta(seconds=ENQUEUE_GRACE_SECONDS + 1)
    Agent.objects.filter(pk=agent.pk).update(updated_at=claimed)
    assert recover_state(ME).spawning_dropped == 1


def test_a_spawn_slot_claimed_just_now_whose_job_is_not_in_rq_yet_is_kept():
    # start_waiting_spawns commits the claim (rq_job_id, updated_at) before the job reaches Redis;
    # a recovery in between (a sweeper booting right after a console restart) must not drop it.
    agent = seed_agent(make_scaler("c"), rq_job_id="spawn-being-enqueued", updated_at=timezone.now())
    r = recover_state(ME)
    assert (r.spawning_dropped, r.spawning_agents_rehydrated) == (0, 1)
    agent.refresh_from_db()
    assert agent.state == AgentState.SPAWNING


@pytest.fixture
def spawn_queue():
    """A host queue of this test's own on the real Redis (no worker drains it), emptied after."""
    queue = Queue(
        f"recovery-{os.getpid()}-{threading.get_ident()}",
        connection=django_rq.get_connection("default"),
        serializer=settings.KICI_JOB_SERIALIZER,
    )
    yield queue
    for registry in (queue.failed_job_registry, queue.finished_job_registry, queue.scheduled_job_registry):
        for job_id in registry.get_job_ids():
            registry.remove(job_id, delete_job=True)
    queue.delete(delete_jobs=True)


def claimed_long_ago(agent, job_id):
    """The agent's spawn slot was claimed for ``job_id`` past the enqueue grace."""
    claimed = timezone.now() - timedelta(seconds=ENQUEUE_GRACE_SECONDS + 1)
    Agent.objects.filter(pk=agent.pk).update(rq_job_id=job_id, updated_at=claimed)


def recover_in_the_spawn_job() -> tuple[int, int]:
    """A spawn job's stand-in: the sweeper boots while the worker runs it (rq says ``started``)."""
    r = recover_state(ME)
    return r.spawning_dropped, r.spawning_agents_rehydrated


def failing_spawn_job() -> None:
    raise RuntimeError("the backend call crashed")


@pytest.mark.parametrize("status", ["queued", "scheduled", "deferred"])
def test_a_local_spawn_whose_job_waits_in_rq_is_kept_by_the_default_check(spawn_queue, status):
    agent = seed_agent(make_scaler("c"))
    job_id = f"spawn-{agent.agent_id}"
    if status == "queued":
        job = spawn_queue.enqueue("os.getpid", job_id=job_id)
    elif status == "scheduled":
        job = spawn_queue.enqueue_in(timedelta(hours=1), "os.getpid", job_id=job_id)
    else:
        blocker = spawn_queue.enqueue_in(timedelta(hours=1), "os.getpid", job_id=f"{job_id}-before")
        job = spawn_queue.enqueue("os.getpid", job_id=job_id, depends_on=blocker)
    assert job.get_status(refresh=True) == status
    claimed_long_ago(agent, job_id)
    r = recover_state(ME)
    assert (r.spawning_dropped, r.spawning_agents_rehydrated) == (0, 1)
    agent.refresh_from_db()
    assert (agent.state, agent.failure_reason) == (AgentState.SPAWNING, "")


def test_a_local_spawn_whose_job_runs_in_a_worker_is_kept_by_the_default_check(spawn_queue):
    # The healthy spawn of a sweeper restart: the worker runs the backend call (rq says started)
    # when the new sweeper's recovery asks; the spawn finishes later and the agent registers.
    agent = seed_agent(make_scaler("c"), spawn_started_at=timezone.now())
    job = spawn_queue.enqueue(recover_in_the_spawn_job, job_id=f"spawn-{agent.agent_id}")
    claimed_long_ago(agent, job.id)
    SimpleWorker([spawn_queue], connection=spawn_queue.connection, serializer=settings.KICI_JOB_SERIALIZER).work(
        burst=True
    )
    assert job.get_status(refresh=True) == "finished"
    assert job.return_value() == [0, 1]  # JSON: a tuple comes back as a list
    agent.refresh_from_db()
    assert (agent.state, agent.failure_reason) == (AgentState.SPAWNING, "")
    assert Reservation.objects.filter(agent=agent).exists()


def test_a_local_spawn_whose_job_failed_is_dropped_by_the_default_check(spawn_queue):
    agent = seed_agent(make_scaler("c"), spawn_started_at=timezone.now())
    job = spawn_queue.enqueue(failing_spawn_job, job_id=f"spawn-{agent.agent_id}")
    SimpleWorker([spawn_queue], connection=spawn_queue.connection, serializer=settings.KICI_JOB_SERIALIZER).work(
        burst=True
    )
    assert job.get_status(refresh=True) == "failed"
    claimed_long_ago(agent, job.id)
    assert recover_state(ME).spawning_dropped == 1


def test_a_local_spawn_still_waiting_for_a_spawn_slot_is_kept_by_the_default_check():
    seed_agent(make_scaler("c"))  # no rq job yet: it waits for a slot, nothing of it runs
    r = recover_state(ME)
    assert (r.spawning_dropped, r.spawning_agents_rehydrated) == (0, 1)


def test_buffered_events_lost_is_always_zero_and_the_report_is_stored():
    seed_agent(make_scaler("c"))
    r = recover_state(ME, trigger="leader-change", spawn_alive=lambda a: False)
    assert r.buffered_events_lost == 0
    report = RecoveryReport.objects.get()
    assert (report.instance_id, report.trigger, report.spawning_dropped, report.reservations_dropped) == (
        ME,
        "leader-change",
        1,
        0,  # a dropped spawn's reservation goes with its teardown
    )
    assert report.error == ""


def test_recovery_logs_the_counts(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="scalers.admission"):
        recover_state(ME)
    assert "spawning_dropped=0" in caplog.text and "reservations_dropped=0" in caplog.text


def test_only_one_process_leads_and_another_takes_over():
    a, b = Leadership(), Leadership()
    try:
        assert a.poll() == (True, True)
        assert b.poll() == (False, False)
        assert a.poll() == (True, False)
        a.release()
        assert b.poll() == (True, True)
    finally:
        a.release()
        b.release()


def test_a_leader_whose_connection_dies_loses_leadership_to_the_next():
    a, b = Leadership(), Leadership()
    try:
        assert a.poll()[0]
        a._conn.close()  # the session ends: PostgreSQL releases the advisory lock
        assert a.poll() == (False, False)
        assert b.poll() == (True, True)
    finally:
        a.release()
        b.release()


def test_the_lock_session_gives_a_silent_host_up_within_seconds_on_both_ends():
    """A vanished host sends no FIN: the keepalives of both sockets end its session (and so its
    lock) within DEAD_PEER_SECONDS, not after PostgreSQL's default two hours."""
    lead = Leadership()
    try:
        assert lead.poll()[0]
        server = dict(
            lead._conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')"
            ).fetchall()
        )
        assert server == {
            "tcp_keepalives_idle": str(KEEPALIVE_IDLE),
            "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL),
            "tcp_keepalives_count": str(KEEPALIVE_COUNT),
            "tcp_user_timeout": str(DEAD_PEER_SECONDS * 1000),
        }
        client = socket.socket(fileno=os.dup(lead._conn.fileno()))
        try:
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_COUNT
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == DEAD_PEER_SECONDS * 1000
        finally:
            client.close()
        assert DEAD_PEER_SECONDS <= 5  # with the 5 s round, another host leads within 10 s
    finally:
        lead.release()


@pytest.mark.docker
def test_the_sweeper_recovers_at_boot_and_sweeps_when_leading(settings, docker_client):
    settings.KICI_INSTANCE_ID = ME
    lost = seed_agent(make_scaler("c"), rq_job_id="spawn-gone")  # its spawn job was lost with its worker
    claimed = timezone.now() - timedelta(seconds=ENQUEUE_GRACE_SECONDS + 1)
    Agent.objects.filter(pk=lost.pk).update(updated_at=claimed)
    call_command("scaler_sweeper", "--once", "--no-warm-pools")
    report = RecoveryReport.objects.get()
    assert (report.trigger, report.spawning_dropped) == ("boot", 1)
    assert not Reservation.objects.exists()


def test_the_sweeper_still_recovers_when_another_process_leads(settings):
    settings.KICI_INSTANCE_ID = ME
    seed_agent(make_scaler("c"), state=AgentState.FAILED)
    other = Leadership()
    try:
        assert other.poll()[0]
        call_command("scaler_sweeper", "--once", "--no-warm-pools")
    finally:
        other.release()
    assert RecoveryReport.objects.get().reservations_dropped == 1
