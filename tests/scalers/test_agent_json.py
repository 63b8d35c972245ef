"""``GET /api/v1/agents/<agentId>`` reads its agent with a statement written by hand: it answers
what the ORM's view of the same agent (``agent_json``) says, field by field."""

from __future__ import annotations

import json

import pytest
from django.http import JsonResponse
from django.test import Client

from scalers.api import agent_json, agent_values
from tests.support.scalers import agent_field_cases, make_agent, make_scaler

pytestmark = pytest.mark.django_db

TOKEN = "agent-json-test-token"


@pytest.mark.parametrize(("state", "fields"), agent_field_cases())
def test_the_agent_get_answers_what_the_orm_reads(settings, state, fields):
    settings.KICI_API_TOKEN = TOKEN
    agent = make_agent(make_scaler(), state, **fields)
    agent.refresh_from_db()
    response = Client().get(f"/api/v1/agents/{agent.agent_id}", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response.json() == json.loads(JsonResponse(agent_json(agent)).content)


def test_an_unknown_agent_is_none_and_a_404(settings):
    settings.KICI_API_TOKEN = TOKEN
    assert agent_values("nobody") is None
    response = Client().get("/api/v1/agents/nobody", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 404 and response.json()["reason"] == "not-found"
