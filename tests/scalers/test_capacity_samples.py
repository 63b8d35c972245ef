"""Capacity samples: one row per scaler per interval with the figures and caps of that moment and
the scale->registered percentiles since the previous sample; written by the leader only; pruned
after 48 h in batches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import agents.retention
from agents.choices import AgentState
from agents.models import Agent
from operations.management.commands.scaler_sweeper import Command
from scalers.leader import Leadership
from scalers.models import CapacitySample, Reservation
from scalers.samples import prune_samples, take_samples
from tests.support.scalers import make_agent, make_scaler

GIB = 1 << 30


def registered(scaler, at, seconds: float, **fields) -> Agent:
    """A running agent admitted ``seconds`` before it registered at ``at``."""
    agent = make_agent(scaler, AgentState.RUNNING, **fields)
    Agent.objects.filter(pk=agent.pk).update(created_at=at - timedelta(seconds=seconds), registered_at=at)
    return agent


@pytest.mark.django_db
def test_a_sample_holds_the_reserved_figures_the_caps_and_the_latency_percentiles(settings):
    settings.KICI_CAPACITY_SAMPLE_SECONDS = 60
    now = timezone.now()
    busy = make_scaler(max_agents=4, cpu=8, memory=16 * GIB)
    idle = make_scaler(max_agents=2)
    for seconds in (10, 20, 30, 40):
        registered(busy, now - timedelta(seconds=5), seconds)
    registered(busy, now - timedelta(seconds=5), 500, warm=True)  # a warm-pool spawn answers no /scale
    registered(busy, now - timedelta(minutes=5), 900)  # before the window
    make_agent(busy, AgentState.SPAWNING)
    Reservation.objects.filter(scaler=busy).update(cpus=0.5, memory_bytes=GIB // 2)

    assert take_samples(now) == 2
    got = {s.scaler_id: s for s in CapacitySample.objects.all()}
    b, i = got[busy.pk], got[idle.pk]
    assert (b.taken_at, b.agents, b.running, b.cpus, b.memory_bytes) == (now, 7, 6, 3.5, 7 * GIB // 2)
    assert (b.max_agents, b.max_cpu, b.max_memory_bytes) == (4, 8, 16 * GIB)
    assert b.registered == 4
    assert b.latency_p50_seconds == pytest.approx(25.0)
    assert b.latency_p95_seconds == pytest.approx(38.5)
    assert (i.agents, i.cpus, i.memory_bytes, i.max_cpu, i.max_memory_bytes) == (0, 0, 0, None, None)
    assert (i.registered, i.latency_p50_seconds, i.latency_p95_seconds) == (0, None, None)


@pytest.mark.django_db
def test_one_row_per_scaler_per_interval_and_latency_counts_since_the_previous_sample(settings):
    settings.KICI_CAPACITY_SAMPLE_SECONDS = 60
    scaler = make_scaler()
    now = timezone.now()
    registered(scaler, now - timedelta(seconds=1), 12)
    assert take_samples(now) == 1
    registered(scaler, now + timedelta(seconds=20), 3)
    assert take_samples(now + timedelta(seconds=30)) == 0  # not due
    assert take_samples(now + timedelta(seconds=59)) == 0
    assert take_samples(now + timedelta(seconds=60)) == 1
    first, second = CapacitySample.objects.order_by("taken_at")
    assert (first.registered, first.latency_p50_seconds) == (1, pytest.approx(12.0))
    assert (second.registered, second.latency_p50_seconds) == (1, pytest.approx(3.0))  # not counted twice
    settings.KICI_CAPACITY_SAMPLE_SECONDS = 300
    registered(scaler, now + timedelta(seconds=100), 7)  # in the gap: counted in the next sample
    assert take_samples(now + timedelta(seconds=300)) == 0  # the setting sets the cadence
    assert take_samples(now + timedelta(seconds=700)) == 1  # after a pause: since the previous one
    third = CapacitySample.objects.latest("taken_at")
    assert (third.registered, third.latency_p50_seconds) == (1, pytest.approx(7.0))


@pytest.mark.django_db
def test_a_round_of_samples_costs_the_same_queries_however_many_scalers(settings):
    settings.KICI_CAPACITY_SAMPLE_SECONDS = 60
    now = timezone.now()
    registered(make_scaler(), now, 4)
    with CaptureQueriesContext(connection) as one:
        assert take_samples(now) == 1
    for _ in range(5):
        registered(make_scaler(), now + timedelta(seconds=30), 4)
    with CaptureQueriesContext(connection) as six:
        assert take_samples(now + timedelta(seconds=60)) == 6
    assert len(one) == len(six) == 6


@pytest.mark.django_db(transaction=True)
def test_only_the_leading_sweeper_samples(settings):
    settings.KICI_CAPACITY_SAMPLE_SECONDS = 60
    make_scaler(type="event")  # no host to ready
    make_scaler(type="event")
    rival = Leadership()
    assert rival.poll()[0]
    try:
        Command().handle(once=True, no_warm_pools=True)
        assert CapacitySample.objects.count() == 0
    finally:
        rival.release()
    Command().handle(once=True, no_warm_pools=True)
    assert CapacitySample.objects.count() == 2
    assert CapacitySample.objects.values("taken_at").distinct().count() == 1  # one bulk insert, one time


@pytest.mark.django_db
def test_samples_older_than_8_days_are_pruned_in_batches_by_the_retention_unit(monkeypatch):
    monkeypatch.setattr(agents.retention, "BATCH", 2)
    monkeypatch.setattr(agents.retention, "BATCHES_PER_CALL", 2)
    scaler = make_scaler()
    now = timezone.now()
    for hours in (193, 194, 195, 196, 197, 191, 1):
        CapacitySample.objects.create(scaler=scaler, taken_at=now - timedelta(hours=hours), max_agents=1)
    assert prune_samples(now) == 4
    assert prune_samples(now) == 1
    assert prune_samples(now) == 0
    CapacitySample.objects.create(scaler=scaler, taken_at=now - timedelta(hours=200), max_agents=1)
    assert Command().handle_old_records() is True
    taken = CapacitySample.objects.values_list("taken_at", flat=True)
    kept = sorted(round((now - t).total_seconds() / 3600) for t in taken)
    assert kept == [1, 191]
