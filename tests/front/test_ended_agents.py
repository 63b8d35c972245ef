"""An ended agent (destroyed, failed) is never presented as live: its page shows its state and end
where a live agent's shows the "live" indicator, its last heartbeat is a fixed time instead of an
age counting up, and its address is shown as its last one, released (the next agent may hold it).
A live agent's page and row still are live."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db

ENDED = [AgentState.DESTROYED, AgentState.FAILED]


def _times():
    """``(last heartbeat, end)``: a heartbeat 12 s before the end, which is now."""
    end = timezone.now()
    return end - timedelta(seconds=12), end


def _row(html: str, agent) -> str:
    found = re.search(rf'<tr id="agent-{agent.agent_id}".*?</tr>', html, re.S)
    assert found, f"no row of {agent.agent_id}"
    return found.group(0)


def _dd(html: str, term: str) -> str:
    found = re.search(rf"<dt>{term}</dt><dd[^>]*>(.*?)</dd>", html, re.S)
    assert found, f"no {term!r} in the Details panel"
    return found.group(1)


def _status(html: str) -> str:
    """The header's status: the line of the page holding ``#agent-status``."""
    found = re.search(r'^.*id="agent-status".*$', html, re.M)
    assert found, "no #agent-status in the header"
    return found.group(0)


def _fixed(value) -> str:
    """What :func:`front.templatetags.kici_ui.abs_time` renders for ``value``."""
    return f'<time datetime="{value.isoformat()}">{value.astimezone(timezone.UTC):%Y-%m-%d %H:%M:%S} UTC</time>'


@pytest.mark.parametrize("state", ENDED)
def test_an_ended_agents_page_shows_its_end_a_fixed_heartbeat_and_its_released_address(viewer_client, state):
    beat, end = _times()
    agent = make_agent(make_scaler(), state, ip="172.30.0.5", last_heartbeat=beat, finished_at=end)
    html = viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()

    status = _status(html)
    assert f'<span class="badge st-{state}">{state}</span> ended {_fixed(end)}' in status
    assert "data-live-status" not in html and 'class="live"' not in html

    assert _dd(html, "Last heartbeat") == _fixed(beat)
    assert _fixed(beat) in _row(html, agent)  # the summary row
    assert f'<time data-rel datetime="{beat.isoformat()}"' not in html

    assert "172.30.0.5 (released)" in _dd(html, "Last address") and "<dt>Address</dt>" not in html
    assert "172.30.0.5 (released)" in _row(html, agent)


def test_a_live_agents_page_is_live_with_its_address_and_a_ticking_heartbeat(viewer_client):
    beat, _ = _times()
    agent = make_agent(make_scaler(), AgentState.RUNNING, ip="172.30.0.4", last_heartbeat=beat)
    html = viewer_client.get(f"/agents/{agent.agent_id}/").content.decode()

    assert '<span id="agent-status" class="live" data-live-status>connecting</span>' in _status(html)
    ticking = f'<time data-rel datetime="{beat.isoformat()}"'
    assert ticking in _dd(html, "Last heartbeat") and ticking in _row(html, agent)
    assert _dd(html, "Address") == "172.30.0.4" and "<dt>Last address</dt>" not in html
    assert "data-released" not in html


def test_the_list_shows_ended_agents_rows_ended_and_live_ones_live(viewer_client):
    beat, end = _times()
    scaler = make_scaler()
    live = make_agent(scaler, AgentState.RUNNING, ip="172.30.0.4", last_heartbeat=beat)
    ended = {
        state: make_agent(scaler, state, ip=f"172.30.0.{5 + n}", last_heartbeat=beat, finished_at=end)
        for n, state in enumerate(ENDED)
    }
    html = viewer_client.get("/agents/?state=all").content.decode()

    row = _row(html, live)
    assert '<td class="col-opt mono nowrap">172.30.0.4</td>' in row and "data-released" not in row
    assert f'<time data-rel datetime="{beat.isoformat()}"' in row and "is-terminal" not in row
    for n, (state, agent) in enumerate(ended.items()):
        row = _row(html, agent)
        assert 'class="is-terminal"' in row and f'<span class="badge st-{state}"' in row
        assert f"172.30.0.{5 + n} (released)" in row and "data-released" in row
        assert _fixed(beat) in row and f'<time data-rel datetime="{beat.isoformat()}"' not in row
