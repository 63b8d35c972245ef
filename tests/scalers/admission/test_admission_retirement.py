"""Draining and retirement: a scaler removed from the config admits nothing,
drains its idle agents, leaves busy ones alone, and is torn down once empty."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers.lifecycle import mark_draining, retirement_sweep
from scalers.models import Reservation, Scaler, ScalerTeardown
from tests.support.admission import request_scale
from tests.support.scalers import make_scaler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue", "no_enqueue")]


def running(decision, **fields):
    Agent.objects.filter(agent_id=decision.agent).update(
        state=AgentState.RUNNING, registered_at=timezone.now(), **fields
    )
    return Agent.objects.get(agent_id=decision.agent)


def test_a_retiring_scaler_drains_then_is_torn_down(docker_client):
    s = make_scaler("old", max_agents=5)
    idle = running(request_scale(["linux"], "j1", warm=True))
    busy = running(request_scale(["linux"], "j2"), active_jobs=1)
    Scaler.objects.filter(pk=s.pk).update(retiring=True, retiring_since=timezone.now())

    assert request_scale(["linux"], "j3").action == "no-backend"  # admits nothing
    assert retirement_sweep() is True
    assert Agent.objects.get(pk=idle.pk).state == AgentState.DESTROYED
    assert Agent.objects.get(pk=busy.pk).state == AgentState.RUNNING  # its job finishes first
    assert not ScalerTeardown.objects.exists()

    # The job ends and the agent goes away (its own release path); the next sweep tears down.
    Agent.objects.filter(pk=busy.pk).update(state=AgentState.DESTROYED, active_jobs=0)
    Reservation.objects.filter(agent=busy).delete()
    assert retirement_sweep() is True
    assert ScalerTeardown.objects.filter(scaler=s).exists()
    assert retirement_sweep() is False  # done once


def test_a_scaler_back_in_the_config_loses_its_teardown(docker_client):
    s = make_scaler("old", retiring=True)
    assert retirement_sweep() is True
    Scaler.objects.filter(pk=s.pk).update(retiring=False)
    retirement_sweep()
    assert not ScalerTeardown.objects.exists()
    assert request_scale(["linux"], "j").action == "spawning"


def test_reservations_of_a_retiring_scaler_still_count_globally():
    from tests.support.scalers import set_global

    set_global(max_agents=1)
    old = make_scaler("old", label_sets=[["old"]])
    request_scale(["old"], "j1")
    Scaler.objects.filter(pk=old.pk).update(retiring=True)
    make_scaler("new", label_sets=[["new"]])
    assert request_scale(["new"], "j2").cap == "globalMaxAgents"


def test_mark_draining_answers_none_for_an_agent_that_is_not_running():
    make_scaler("c")
    d = request_scale(["linux"], "j")
    assert mark_draining(d.agent) is None  # still spawning
