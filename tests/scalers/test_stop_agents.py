"""``manage.py stop_agents`` (``make stop-agents``) ends this instance's local agents the ordinary
way: a running container agent on the private dockerd loses its container, its row is destroyed
and its slot freed; an agent of another instance and one of an event scaler are left alone."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import Reservation
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def test_it_tears_down_this_instances_local_agents_and_nothing_else(docker_client, agent_image, settings):
    scaler = make_scaler()
    container = docker_client.containers.run(
        agent_image,
        ["sleep 600"],
        entrypoint=["/bin/sh", "-c"],
        detach=True,
        labels={"kici-managed": "true", "kici-scaler-name": scaler.name},
        network_mode="none",
    )
    try:
        ours = make_agent(scaler, state=AgentState.RUNNING, managed_id=container.id)
        theirs = make_agent(scaler, state=AgentState.RUNNING)
        remote = make_agent(make_scaler(type="event"), state=AgentState.RUNNING)
        Agent.objects.filter(pk__in=[ours.pk, remote.pk]).update(owner_instance=settings.KICI_INSTANCE_ID)
        out = io.StringIO()
        call_command("stop_agents", stdout=out)
        assert f"{ours.agent_id} ({scaler.name}): destroyed" in out.getvalue()
        assert "1 of 1 agent(s) ended" in out.getvalue()
        assert Agent.objects.get(pk=ours.pk).state == AgentState.DESTROYED
        assert not Reservation.objects.filter(agent=ours).exists()
        assert docker_client.containers.list(all=True, filters={"id": container.id}) == []
        assert Agent.objects.get(pk=theirs.pk).state == AgentState.RUNNING
        assert Agent.objects.get(pk=remote.pk).state == AgentState.RUNNING
    finally:
        for c in docker_client.containers.list(all=True, filters={"id": container.id}):
            c.remove(force=True)
