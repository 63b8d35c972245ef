"""Relative times on live pages: ages count on the browser's clock, heartbeats refresh the row, an
agent that ends stops looking live (its heartbeat a fixed time, no "live" badge), and a live row
replaces the "No live agents." placeholder (Debian Chromium against a real daphne)."""

from __future__ import annotations

import json
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import flush_events, record_event
from agents.models import Agent
from agents.tokens import mint_session_token
from scalers.models import ConfigState, LabelSet, Reservation, Scaler

pytestmark = pytest.mark.browser

AGE_OF = """(sel) => {
  const t = document.querySelector(sel);
  if (!t) return null;
  const m = t.textContent.trim().match(/^(\\d+)s ago$/);
  return m ? parseInt(m[1], 10) : (/m ago$/.test(t.textContent) ? 999 : null);
}"""


def _scaler() -> Scaler:
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    scaler = Scaler.objects.create(name="ui-times", type="container", max_agents=4)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")
    return scaler


def _heartbeat(base: str, agent: Agent, token: str) -> int:
    request = urllib.request.Request(
        f"{base}/api/v1/agents/{agent.agent_id}/heartbeat",
        data=json.dumps({"activeJobs": 0}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def test_a_heartbeat_age_counts_up_in_the_browser_and_resets_on_a_heartbeat(browser_page, wait_live, live_daphne):
    scaler = _scaler()
    agent = Agent.objects.create(
        agent_id="scaler-container-7135e001",
        scaler=scaler,
        label_set=scaler.label_sets.get(),
        state=AgentState.RUNNING,
        labels=["linux"],
        registered_at=timezone.now(),
        last_heartbeat=timezone.now() - timedelta(seconds=50),
    )
    Reservation.objects.create(scaler=scaler, agent=agent, cpus=1, memory_bytes=2**30, owner_instance="ui")
    token = mint_session_token(agent)
    page = browser_page()
    page.goto("/")
    wait_live(page)
    cell = f"#agent-{agent.agent_id} td:nth-child(9) time[data-rel]"
    start = page.evaluate(AGE_OF, cell)
    assert start is not None and 49 <= start <= 53, start
    # No push: the browser's clock alone moves the age on.
    page.wait_for_function(f"({AGE_OF})({json.dumps(cell)}) >= {start + 4}", timeout=9000)

    assert _heartbeat(live_daphne, agent, token) == 200
    page.wait_for_function(
        f"({AGE_OF})({json.dumps(cell)}) !== null && ({AGE_OF})({json.dumps(cell)}) < 10", timeout=8000
    )
    assert page.locator(f"#agent-{agent.agent_id}").count() == 1
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors


def _end(agent: Agent) -> None:
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED, finished_at=timezone.now())
    record_event(Agent.objects.select_related("scaler").get(pk=agent.pk), EventType.DESTROYED, "torn down")
    assert flush_events(5)


def test_an_agent_that_ends_on_its_open_page_stops_looking_live(browser_page, wait_live, off_loop):
    scaler = _scaler()
    beat = timezone.now() - timedelta(seconds=50)
    agent = Agent.objects.create(
        agent_id="scaler-container-7135e003",
        scaler=scaler,
        label_set=scaler.label_sets.get(),
        state=AgentState.RUNNING,
        labels=["linux"],
        ip="172.30.0.9",
        registered_at=beat,
        last_heartbeat=beat,
    )
    page = browser_page()
    page.goto(f"/agents/{agent.agent_id}/")
    wait_live(page)
    assert page.locator("#agent-status").inner_text() == "live"
    row = f"#agent-{agent.agent_id}"
    details = "xpath=//*[@id='agent-details']//dt[.='Last heartbeat']/following-sibling::dd[1]"
    ticking = f"{row} time[data-rel][datetime='{beat.isoformat()}']"
    assert page.locator(ticking).count() == 1 and page.evaluate(AGE_OF, f"{row} td:nth-child(9) time") >= 49

    off_loop(_end, agent)
    page.wait_for_selector(f"{row}[data-state='destroyed']")
    page.wait_for_selector("#agent-status:not([data-live-status])")
    status = page.locator("#agent-status").inner_text()
    assert status.startswith("destroyed ended ") and status.endswith(" UTC"), status
    assert page.locator("[data-live-status]").count() == 0
    assert "live" not in page.locator(".page-head .actions").inner_text()

    cells = [page.locator(f"{row} td:nth-child(9)"), page.locator(details)]
    shown = [cell.inner_text() for cell in cells]
    page.wait_for_timeout(2500)  # the browser's clock would have moved an age on by now
    assert [cell.inner_text() for cell in cells] == shown
    assert all(text.endswith(" UTC") and "ago" not in text for text in shown), shown
    assert page.locator(ticking).count() == 0
    assert "172.30.0.9 (released)" in page.locator(row).inner_text()
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors


def test_the_placeholder_goes_when_the_first_live_agent_arrives(browser_page, wait_live, off_loop):
    scaler = _scaler()
    page = browser_page()
    page.goto("/")
    wait_live(page)
    placeholder = page.locator("#agent-rows tr.empty-row")
    assert placeholder.inner_text().strip() == "No live agents."

    agent = Agent.objects.create(
        agent_id="scaler-container-7135e002",
        scaler=scaler,
        label_set=scaler.label_sets.get(),
        state=AgentState.SPAWNING,
        labels=["linux"],
    )
    off_loop(record_event, agent, EventType.PROVISIONING, "creating container")
    page.locator(f"#agent-rows > #agent-{agent.agent_id}").wait_for()
    page.wait_for_function("!document.querySelector('#agent-rows tr.empty-row')")
    assert page.locator("#agent-rows > tr").count() == 1
