"""A Redis emptied under a running console (a ``FLUSHDB``, or a restart without persistence) loses
no agent and holds no slot: a real console on loopback (daphne, one rq worker, the sweeper; see
``tests/support/soak.py``) with bare-metal process agents. One agent runs; a second is admitted
while the worker is stopped, so its spawn job waits in Redis; then Redis is emptied and the worker
started again. The waiting spawn is ended (``spawn-job-lost``) within the sweeper's round and its
slot given back; the running agent keeps running and heartbeating through several lost-agent
sweeps; and the console still admits, spawns and registers a new agent."""

from __future__ import annotations

import time

import pytest
import redis
import requests
from django.conf import settings

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import Reservation
from tests.support.soak import Orchestrator, run_console

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The sweeper judges a spawn job 10 s after it was enqueued, in a round every second.
LOST_WITHIN_SECONDS = 30.0
#: Seconds the running agent is watched after the flush: more than two lost-agent sweeps (5 s).
WATCH_SECONDS = 12.0


def _wait(done, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = done()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"not within {timeout:g} s: {what}")


def _admitted(orchestrator: Orchestrator, job_id: str) -> str:
    admitted = orchestrator.scale(job_id, time.monotonic() + 30)
    assert not isinstance(admitted, str), admitted
    return admitted[0]


def test_an_emptied_redis_loses_no_agent_and_holds_no_slot(tmp_path):
    with run_console(tmp_path, max_agents=3, workers=1) as console:
        orchestrator = Orchestrator(console, seed=0)
        running = _admitted(orchestrator, "flush-running")
        assert not isinstance(orchestrator.wait_registered(running), str)

        console.launcher.stop("worker-1")  # the next spawn's job waits in Redis
        waiting = _admitted(orchestrator, "flush-waiting")
        row = Agent.objects.get(agent_id=waiting)
        assert row.state == AgentState.SPAWNING and row.rq_job_id, (row.state, row.rq_job_id)

        redis.Redis.from_url(settings.REDIS_URL).flushdb()
        flushed = time.monotonic()
        console.launcher.start("worker-1")

        ended = _wait(
            # Ended: past the teardown's own destroying step too.
            lambda: (
                Agent.objects.filter(agent_id=waiting)
                .exclude(state__in=(AgentState.SPAWNING, AgentState.DESTROYING))
                .first()
            ),
            LOST_WITHIN_SECONDS,
            f"the spawn whose job was flushed ended (still {Agent.objects.get(agent_id=waiting).state})",
        )
        assert ended.state == AgentState.FAILED, ended.state
        assert "gone from Redis" in ended.failure_reason, ended.failure_reason
        assert not Reservation.objects.filter(agent__agent_id=waiting).exists()

        # The running agent was never judged lost: it kept heartbeating through the flush.
        before = Agent.objects.get(agent_id=running).last_heartbeat
        time.sleep(max(3.0, WATCH_SECONDS - (time.monotonic() - flushed)))  # a few heartbeats (1 s) at least
        kept = Agent.objects.get(agent_id=running)
        assert kept.state == AgentState.RUNNING, (kept.state, kept.failure_reason)
        assert kept.last_heartbeat > before

        # The worker takes jobs again: a new agent spawns and registers.
        fresh = _admitted(orchestrator, "flush-fresh")
        assert not isinstance(orchestrator.wait_registered(fresh), str)
        health = requests.get(console.url + "/healthz", timeout=5).json()["checks"]
        assert health["database"]["ok"] and health["redis"]["ok"], health
        # The soak console serves only its host queue; that one is listened on again.
        assert console.launcher.argv["worker-1"][3] not in health["workers"]["detail"], health
        assert Reservation.objects.filter(scaler=console.scaler).count() == 2
