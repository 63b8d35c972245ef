"""What the pages give the live rows and the ticking clock: each list's own socket with its
filters, heartbeat ages coloured by the heartbeat interval and timeout, and an ended agent's last
heartbeat as a fixed time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.template import Context, Template
from django.utils import timezone

from agents.choices import AgentState
from front.views.dashboard import DASHBOARD_AGENT_LIMIT
from front.views.scalers import SCALER_AGENT_LIMIT
from live.rows import agent_page_version
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def _age(agent) -> str:
    return Template("{% load kici_ui %}{% heartbeat_age agent %}").render(Context({"agent": agent}))


@pytest.mark.parametrize(("seconds", "level"), [(3, "age-ok"), (12, "age-warn"), (95, "age-late")])
def test_a_heartbeat_age_is_amber_after_two_intervals_and_red_after_the_timeout(seconds, level, settings):
    settings.KICI_AGENT_HEARTBEAT_TIMEOUT_SECONDS = 90
    agent = make_agent(make_scaler(), AgentState.RUNNING, last_heartbeat=timezone.now() - timedelta(seconds=seconds))
    html = _age(agent)
    assert f'class="{level}" data-warn-after="10" data-late-after="90"' in html and "<time data-rel" in html


@pytest.mark.parametrize("state", [AgentState.DESTROYED, AgentState.FAILED])
def test_an_ended_agents_heartbeat_is_a_fixed_time_not_an_age(state):
    agent = make_agent(make_scaler(), state, last_heartbeat=timezone.now() - timedelta(hours=1))
    html = _age(agent)
    assert html.startswith("<time datetime=") and html.endswith(" UTC</time>")
    assert "data-rel" not in html and "data-warn-after" not in html and "age-" not in html


def test_a_destroying_agents_heartbeat_still_ages_but_is_not_coloured():
    agent = make_agent(make_scaler(), AgentState.DESTROYING, last_heartbeat=timezone.now() - timedelta(hours=1))
    html = _age(agent)
    assert "<time data-rel" in html and "data-warn-after" not in html and "age-" not in html


def test_each_list_page_opens_its_own_rows_socket(viewer_client):
    scaler = make_scaler("live-markup")
    agent = make_agent(scaler, AgentState.RUNNING)
    pages = {
        "/": f"/ws/rows/agents/?state=active&amp;limit={DASHBOARD_AGENT_LIMIT}",
        "/agents/?state=failed&q=x": "/ws/rows/agents/?state=failed&amp;q=x&amp;page=1",
        "/agents/?label=GPU&sort=-last_heartbeat&page=1": (
            "/ws/rows/agents/?state=active&amp;label=gpu&amp;sort=-last_heartbeat&amp;page=1"
        ),
        f"/scalers/{scaler.name}/": (
            f"/ws/rows/agents/?scaler=live-markup&amp;state=active&amp;limit={SCALER_AGENT_LIMIT}"
        ),
        f"/agents/{agent.agent_id}/": f"/ws/rows/agent/?id={agent.agent_id}&amp;v={agent_page_version(agent)}",
        "/scalers/": "/ws/rows/scalers/",
    }
    for url, socket in pages.items():
        html = viewer_client.get(url).content.decode()
        assert f'ws-connect="{socket}"' in html, url
