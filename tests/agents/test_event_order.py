"""Lifecycle events are stored in the order they happened: ``agent.connecting`` ("waiting for agent
registration") is never stored after ``agent.registered``."""

from __future__ import annotations

import json

import pytest

from agents.choices import EventType
from agents.events import record_connecting
from agents.models import ScalerEvent
from agents.tokens import mint_registration_token
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def stored_types(agent) -> list[str]:
    return list(ScalerEvent.objects.filter(agent=agent).order_by("created_at", "id").values_list("type", flat=True))


def test_connecting_is_stored_while_the_agent_waits_and_never_after_it_registered(client):
    agent = make_agent(make_scaler())
    assert record_connecting(agent, "waiting for agent registration") is not None
    token = mint_registration_token(agent)
    answer = client.post(
        "/api/v1/agents/register",
        data=json.dumps({}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert answer.status_code == 200, answer.content
    assert record_connecting(agent, "waiting for agent registration") is None
    assert stored_types(agent) == [EventType.CONNECTING, EventType.REGISTERED]


def test_an_agent_that_registered_first_gets_no_connecting_event(client):
    agent = make_agent(make_scaler())
    token = mint_registration_token(agent)
    answer = client.post(
        "/api/v1/agents/register", data="", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert answer.status_code == 200, answer.content
    assert record_connecting(agent, "waiting for agent registration") is None
    assert stored_types(agent) == [EventType.REGISTERED]
