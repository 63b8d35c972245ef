"""The counts beside the live lists follow the live rows in Debian Chromium against a real daphne:
``/agents/``'s "N agents" when its agents end or new ones appear, and the dashboard's
"all N live agents" link when agents are spawned, all without reload."""

from __future__ import annotations

import pytest

from agents.choices import AgentState, EventType
from agents.events import flush_events, record_event
from agents.models import Agent
from scalers.models import ConfigState, LabelSet, Scaler

pytestmark = pytest.mark.browser


def _scaler() -> Scaler:
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    scaler = Scaler.objects.create(name="ui-counts", type="container", max_agents=10)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")
    return scaler


def _agent(scaler: Scaler, n: int, state=AgentState.RUNNING) -> Agent:
    return Agent.objects.create(
        agent_id=f"scaler-container-c0c0{n:04x}",
        scaler=scaler,
        label_set=scaler.label_sets.get(),
        state=state,
        labels=["linux"],
    )


def _events(agent_ids: list[str], type: str, detail: str, **update) -> None:
    """Change the agents, record an event of each and wait until they were pushed."""
    if update:
        Agent.objects.filter(agent_id__in=agent_ids).update(**update)
    for agent in Agent.objects.select_related("scaler").filter(agent_id__in=agent_ids):
        record_event(agent, type, detail)
    assert flush_events(5)


def _text(page, selector: str) -> str:
    return page.locator(selector).inner_text().strip()


def test_the_agents_lists_count_follows_agents_that_end_and_agents_that_appear(browser_page, wait_live, off_loop):
    scaler = _scaler()
    agents = [_agent(scaler, n) for n in range(5)]
    page = browser_page()
    page.goto("/agents/")
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")
    assert _text(page, "#list-count") == "5 agents"

    # Released: torn down, they leave the list of active agents.
    off_loop(_events, [a.agent_id for a in agents], EventType.DESTROYED, "released", state=AgentState.DESTROYED)
    page.locator("#agent-rows tr.empty-row").get_by_text("No agent matches these filters.").wait_for()
    page.locator("#list-count").get_by_text("0 agents", exact=True).wait_for(timeout=3000)

    new = _agent(scaler, 9, AgentState.SPAWNING)
    off_loop(_events, [new.agent_id], EventType.PROVISIONING, "creating container")
    page.locator(f"#agent-rows > #agent-{new.agent_id}").wait_for()
    page.locator("#list-count").get_by_text("1 agent", exact=True).wait_for(timeout=3000)
    assert page.evaluate("window.__not_reloaded") is True
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors


def test_the_dashboards_live_agents_link_counts_agents_spawned_after_load(browser_page, wait_live, off_loop):
    scaler = _scaler()
    page = browser_page()
    page.goto("/")
    wait_live(page)
    page.wait_for_selector("[data-rows-socket]", state="attached")
    page.evaluate("window.__not_reloaded = true")
    link = page.locator("#live-agents-count a")
    assert link.inner_text().strip() == "all 0 live agents →"

    agents = [_agent(scaler, n, AgentState.SPAWNING) for n in range(5)]
    off_loop(_events, [a.agent_id for a in agents], EventType.PROVISIONING, "creating container")
    page.locator("#agent-rows > tr[id]").nth(4).wait_for()
    link.get_by_text("all 5 live agents →").wait_for(timeout=3000)
    assert page.locator("#live-agents-count a").get_attribute("href") == "/agents/"
    assert page.evaluate("window.__not_reloaded") is True
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors
