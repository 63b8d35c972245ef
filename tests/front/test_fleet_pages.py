"""The pages that list agents at fleet size: the dashboard and a scaler page show counts and a first
page of live agents, and none of them runs more
queries for a larger fleet."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from front.views.dashboard import DASHBOARD_AGENT_LIMIT
from front.views.scalers import SCALER_AGENT_LIMIT
from scalers.labels import normalize_label_set
from scalers.models import ConfigState, LabelSet
from tests.support.scalers import make_scaler

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr id="agent-([^"]+)"')


def add_agents(scaler, n: int, state: str = AgentState.RUNNING, *, label_set=None, start: int = 0, **fields):
    """``n`` agents of ``scaler`` named ``<scaler>-<i>`` (``start`` ≤ i < ``start + n``); agent i
    was created i minutes ago, so a higher i is older. Returns them in that order."""
    label_set = label_set or scaler.label_sets.first()
    now = timezone.now()
    made = Agent.objects.bulk_create(
        Agent(
            agent_id=f"{scaler.name}-{i:04d}",
            scaler=scaler,
            label_set=label_set,
            state=state,
            labels=[*label_set.labels, f"kici:scaler:{scaler.name}"],
            **fields,
        )
        for i in range(start, start + n)
    )
    for i, agent in enumerate(made, start):
        agent.created_at = now - timedelta(minutes=i)
    Agent.objects.bulk_update(made, ["created_at"])
    return made


def rows(html: str) -> list[str]:
    return ROW.findall(html)


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


@pytest.fixture
def fleet():
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10_000})
    return make_scaler("fleet-a", max_agents=1000), make_scaler("fleet-b", max_agents=1000)


def test_the_dashboard_lists_the_newest_live_agents_and_counts_the_rest(viewer_client, fleet):
    a, b = fleet
    add_agents(a, 20)
    add_agents(b, 20, AgentState.SPAWNING, start=100)
    add_agents(a, 5, AgentState.FAILED, start=200)
    html = viewer_client.get("/").content.decode()
    shown = rows(html)
    assert shown == [f"fleet-a-{i:04d}" for i in range(20)] + [
        f"fleet-b-{i:04d}" for i in range(100, 100 + DASHBOARD_AGENT_LIMIT - 20)
    ]
    assert f"the newest {DASHBOARD_AGENT_LIMIT} of 40" in html
    assert 'href="/agents/">all 40 live agents →' in html
    # The counts per scaler and state are on its capacity card.
    assert "20 spawning" in html and "20 running" in html


def test_a_retiring_scaler_has_a_card_only_while_it_has_live_agents(viewer_client, fleet):
    gone = make_scaler("fleet-gone", retiring=True)
    draining = make_scaler("fleet-draining", retiring=True)
    add_agents(gone, 2, AgentState.DESTROYED)
    add_agents(draining, 1, AgentState.DRAINING)
    html = viewer_client.get("/").content.decode()
    cards = re.findall(r'<div class="card" id="cap-scaler-(\d+)"', html)
    assert sorted(map(int, cards)) == sorted(s.pk for s in [*fleet, draining])
    assert gone.pk not in map(int, cards)


def test_the_scaler_page_lists_a_page_and_counts_per_label_set(viewer_client, fleet):
    a, _ = fleet
    second = LabelSet.objects.create(
        scaler=a, index=1, labels=["gpu"], normalized=normalize_label_set(["gpu"]), config={"image": "x"}
    )
    add_agents(a, 30)
    add_agents(a, 3, label_set=second, start=100)
    add_agents(a, 4, AgentState.DESTROYED, label_set=second, start=200)
    html = viewer_client.get("/scalers/fleet-a/").content.decode()
    assert rows(html) == [f"fleet-a-{i:04d}" for i in range(SCALER_AGENT_LIMIT)]
    assert f"the newest {SCALER_AGENT_LIMIT} of 33" in html
    assert 'href="/agents/?scaler=fleet-a">all 33 live agents →' in html
    live_counts = re.findall(r'<tr id="label-set-(\d)".*?<td class="num col-opt">(\d+)</td>', html, re.S)
    assert live_counts == [("0", "30"), ("1", "3")]


@pytest.mark.parametrize("url", ["/", "/agents/", "/scalers/fleet-a/"])
def test_queries_do_not_grow_with_the_fleet(viewer_client, fleet, url):
    a, b = fleet
    add_agents(a, 10)
    add_agents(b, 5, AgentState.FAILED, start=100)
    viewer_client.get(url)  # sessions, permissions and content types cached as in steady use
    small = queries(viewer_client, url)
    add_agents(a, 120, start=1000, last_heartbeat=timezone.now())
    add_agents(b, 60, AgentState.DRAINING, start=2000)
    add_agents(b, 60, AgentState.FAILED, start=3000)
    assert queries(viewer_client, url) == small
