"""Live rows in Debian Chromium against a real daphne: agents appear on /agents/, leave the
dashboard's live list when they fail, and heartbeat ages tick and change colour, all without reload."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import flush_events, record_event
from agents.models import Agent
from scalers.models import ConfigState, LabelSet, Scaler

pytestmark = pytest.mark.browser


def _scaler(name: str = "ui-rows") -> Scaler:
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    scaler = Scaler.objects.create(name=name, type="container", max_agents=4)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")
    return scaler


def _agent(scaler: Scaler, agent_id: str, state=AgentState.RUNNING, **fields) -> Agent:
    return Agent.objects.create(
        agent_id=agent_id, scaler=scaler, label_set=scaler.label_sets.get(), state=state, labels=["linux"], **fields
    )


def _event(agent: Agent, type: str, detail: str) -> None:
    record_event(Agent.objects.select_related("scaler").get(pk=agent.pk), type, detail)
    assert flush_events(5)


def test_a_new_agent_appears_on_the_agents_list_without_reload(browser_page, wait_live, off_loop):
    scaler = _scaler()
    page = browser_page()
    page.goto("/agents/")
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")
    assert page.locator("#agent-rows tr.empty-row").count() == 1

    agent = _agent(scaler, "scaler-container-70e50001", state=AgentState.SPAWNING)
    off_loop(_event, agent, EventType.PROVISIONING, "creating container")
    page.locator(f"#agent-rows > #agent-{agent.agent_id}").wait_for()
    page.wait_for_function("!document.querySelector('#agent-rows tr.empty-row')")
    assert "spawning" in page.locator(f"#agent-{agent.agent_id}").inner_text()
    assert page.evaluate("window.__not_reloaded") is True
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors


def test_a_failed_agent_leaves_the_dashboards_live_agents(browser_page, wait_live, off_loop):
    scaler = _scaler()
    agent = _agent(scaler, "scaler-container-70e50002")
    page = browser_page()
    page.goto("/")
    wait_live(page)
    page.wait_for_selector("[data-rows-socket]", state="attached")
    page.evaluate("window.__not_reloaded = true")
    page.locator(f"#agent-rows > #agent-{agent.agent_id}").wait_for()

    Agent.objects.filter(pk=agent.pk).update(state=AgentState.FAILED, failure_reason="image pull failed")
    off_loop(_event, agent, EventType.FAILED, "image pull failed")
    page.locator(f"#agent-{agent.agent_id}").wait_for(state="detached")
    page.locator("#event-rows").get_by_text("image pull failed").wait_for()  # the event feed still says why
    page.locator("#agent-rows tr.empty-row").get_by_text("No live agents.").wait_for()
    assert page.evaluate("window.__not_reloaded") is True


def test_a_heartbeat_age_ticks_every_second_and_turns_amber(browser_page, wait_live):
    scaler = _scaler()
    agent = _agent(
        scaler,
        "scaler-container-70e50003",
        registered_at=timezone.now(),
        last_heartbeat=timezone.now() - timedelta(seconds=7),
    )
    page = browser_page()
    page.goto("/agents/")
    wait_live(page)
    cell = page.locator(f"#agent-{agent.agent_id} td:nth-child(9) time[data-rel]")
    assert cell.get_attribute("data-warn-after") == "10" and cell.get_attribute("data-late-after") == "90"
    assert "age-ok" in cell.get_attribute("class")
    seen = set()
    for _ in range(3):  # one new value a second, on the console's clock, with no push
        page.wait_for_function(
            "([sel, seen]) => { const t = document.querySelector(sel); return t && !seen.includes(t.textContent); }",
            arg=[f"#agent-{agent.agent_id} td:nth-child(9) time", sorted(seen)],
            timeout=2500,
        )
        seen.add(cell.inner_text())
    page.wait_for_function(
        f"document.querySelector('#agent-{agent.agent_id} td:nth-child(9) time').classList.contains('age-warn')",
        timeout=6000,
    )
    assert int(cell.inner_text().split("s")[0]) >= 10  # shown rounded; amber from 10 s on
