"""The teardown rules, without docker: the sandbox is destroyed before the reservation is
released; a destroy that raises, or a backend that cannot be built for an agent that has a
sandbox, keeps the reservation; a finished teardown expires the agent's unused registration
tokens. The backend is a stand-in recording what the ledger held when it was called."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent, AgentToken
from agents.tokens import mint_registration_token
from scalers.lifecycle import teardown_agent
from scalers.models import Reservation
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


class RecordingBackend:
    """Answers ``destroy`` by recording whether the agent's reservation still existed then."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.reserved_during_destroy: list[bool] = []

    def destroy(self, agent, reason):
        self.reserved_during_destroy.append(Reservation.objects.filter(agent__agent_id=agent.agent_id).exists())
        if self.fail:
            raise RuntimeError("the runtime is down")


@pytest.fixture
def running():
    scaler = make_scaler(max_agents=2)
    return make_agent(scaler, AgentState.RUNNING, managed_id="c" * 64)


def test_the_sandbox_is_destroyed_while_the_reservation_still_holds_and_released_after(running):
    backend = RecordingBackend()
    with patch("scalers.lifecycle.get_backend", return_value=backend):
        assert teardown_agent(running, "job-complete") is True
    assert backend.reserved_during_destroy == [True]
    assert not Reservation.objects.filter(agent=running).exists()
    assert Agent.objects.get(pk=running.pk).state == AgentState.DESTROYED


def test_a_destroy_that_raises_keeps_the_reservation_and_the_agent_destroying(running):
    backend = RecordingBackend(fail=True)
    with patch("scalers.lifecycle.get_backend", return_value=backend):
        assert teardown_agent(running, "job-complete") is False
    assert backend.reserved_during_destroy == [True]
    assert Reservation.objects.filter(agent=running).exists()
    assert Agent.objects.get(pk=running.pk).state == AgentState.DESTROYING


def test_a_backend_that_cannot_be_built_keeps_the_reservation_of_an_agent_with_a_sandbox(running):
    with patch("scalers.lifecycle.get_backend", side_effect=ValueError("scaler type unknown here")):
        assert teardown_agent(running, "release") is False
    assert Reservation.objects.filter(agent=running).exists()
    assert Agent.objects.get(pk=running.pk).state == AgentState.DESTROYING


def test_an_agent_with_nothing_created_is_released_even_when_its_backend_cannot_be_built():
    spawning = make_agent(make_scaler(max_agents=2), AgentState.SPAWNING)
    with patch("scalers.lifecycle.get_backend", side_effect=ValueError("scaler type unknown here")):
        assert teardown_agent(spawning, "release") is True
    assert not Reservation.objects.filter(agent=spawning).exists()


def test_a_finished_teardown_expires_the_unused_registration_tokens(running):
    mint_registration_token(running)
    assert AgentToken.objects.filter(agent=running, expires_at__gt=timezone.now()).count() == 1
    with patch("scalers.lifecycle.get_backend", return_value=RecordingBackend()):
        teardown_agent(running, "job-complete")
    assert not AgentToken.objects.filter(agent=running, expires_at__gt=timezone.now()).exists()
