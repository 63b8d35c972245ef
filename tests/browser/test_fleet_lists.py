"""The lists at fleet size in Debian Chromium against a real daphne: a later page of /agents/ keeps
its rows current but gains no new agent, the first page gains it on top and stays one page long, a
bulk selection survives live updates and plans one operation over the ticked agents, and ticked
planned operations are confirmed and approved together."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.choices import AgentState, EventType
from agents.events import flush_events, record_event
from agents.listing import LIST_PAGE_SIZE
from agents.models import Agent
from operations.models import Operation
from scalers.models import ConfigState, LabelSet, Scaler

pytestmark = pytest.mark.browser

PERMS = ("operations.view_operation", "operations.request_operation")


def _fleet(n: int) -> list[Agent]:
    """``n`` running agents of one scaler, ``ui-fleet-<i>`` created i minutes ago."""
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 1000})
    scaler = Scaler.objects.create(name="ui-fleet", type="container", max_agents=1000)
    ls = LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux")
    now = timezone.now()
    agents = Agent.objects.bulk_create(
        Agent(agent_id=f"ui-fleet-{i:04d}", scaler=scaler, label_set=ls, state=AgentState.RUNNING, labels=["linux"])
        for i in range(n)
    )
    for i, agent in enumerate(agents):
        agent.created_at = now - timedelta(minutes=i + 1)
    Agent.objects.bulk_update(agents, ["created_at"])
    return agents


def _event(agent_id: str, type: str, detail: str, **update) -> None:
    if update:
        Agent.objects.filter(agent_id=agent_id).update(**update)
    record_event(Agent.objects.select_related("scaler").get(agent_id=agent_id), type, detail)
    assert flush_events(5)


def _new_agent(agent_id: str) -> None:
    scaler = Scaler.objects.get(name="ui-fleet")
    Agent.objects.create(
        agent_id=agent_id, scaler=scaler, label_set=scaler.label_sets.get(), state=AgentState.SPAWNING, labels=["linux"]
    )
    _event(agent_id, EventType.PROVISIONING, "creating container")


def _row_ids(page) -> list[str]:
    return page.evaluate("Array.from(document.querySelectorAll('#agent-rows > tr[id]'), r => r.id)")


def test_a_later_page_updates_its_rows_and_the_first_page_gains_the_new_agent(browser_page, wait_live, off_loop):
    agents = _fleet(LIST_PAGE_SIZE + 5)
    later = browser_page()
    later.goto("/agents/?page=2")
    wait_live(later)
    later.evaluate("window.__not_reloaded = true")
    before = _row_ids(later)
    assert before == [f"agent-{a.agent_id}" for a in agents[LIST_PAGE_SIZE:]]
    first = browser_page(username="ui-browser-2")
    first.goto("/agents/")
    wait_live(first)
    assert len(_row_ids(first)) == LIST_PAGE_SIZE

    shown = agents[LIST_PAGE_SIZE].agent_id  # on page 2
    off_loop(_event, shown, EventType.DRAINING, "draining", state=AgentState.DRAINING)
    later.locator(f"#agent-{shown} .st-draining").wait_for()
    off_loop(_new_agent, "ui-fleet-new1")
    first.locator("#agent-rows > #agent-ui-fleet-new1").wait_for()
    assert _row_ids(first)[0] == "agent-ui-fleet-new1"
    assert len(_row_ids(first)) == LIST_PAGE_SIZE, "the first page stays one page long"
    later.wait_for_timeout(1500)  # a frame a second at most: the new agent had its chance
    assert _row_ids(later) == before, "a later page neither gains the new agent nor shifts"
    assert later.evaluate("window.__not_reloaded") is True
    assert not [e for e in later.js_errors if "page error" in e], later.js_errors


def test_a_bulk_selection_survives_live_updates_and_plans_one_operation(browser_page, wait_live, off_loop):
    agents = _fleet(4)
    page = browser_page(*PERMS, username="ops-fleet")
    page.goto("/agents/")
    wait_live(page)
    drain = page.get_by_role("button", name="Preview drain of selected…")
    assert drain.is_disabled()
    picked = [agents[0].agent_id, agents[2].agent_id]
    for agent_id in picked:
        page.get_by_label(f"select {agent_id}").check()
    page.locator("[data-picked]").get_by_text("2 selected").wait_for()
    assert drain.is_enabled()

    # A live update replaces a ticked row: it stays ticked.
    off_loop(_event, picked[0], EventType.REGISTERED, "registered", active_jobs=1)
    page.locator(f"#agent-{picked[0]} .badge.b-blue").get_by_text("1 running").wait_for()
    assert page.get_by_label(f"select {picked[0]}").is_checked()

    # "select every agent on this page" ticks all, unticking it clears them
    page.get_by_label("select every agent on this page").check()
    page.locator("[data-picked]").get_by_text("4 selected").wait_for()
    page.get_by_label("select every agent on this page").uncheck()
    page.locator("[data-picked]").get_by_text("none selected").wait_for()
    assert drain.is_disabled()

    for agent_id in picked:
        page.get_by_label(f"select {agent_id}").check()
    drain.click()
    page.wait_for_url(re.compile(r"/operations/plan/$"))
    page.get_by_role("button", name="Request approval").click()
    page.wait_for_url(re.compile(r"/operations/\d+/$"))
    operation = Operation.objects.get()
    assert operation.kind == "agent-drain" and operation.status == "planned"
    assert operation.agent_ids == picked
    for agent_id in picked:
        page.locator("#op-targets").get_by_text(agent_id).first.wait_for()


def test_bulk_approval_ticks_planned_operations_confirms_and_approves_them_all(browser_page):
    from django.conf import settings

    from operations.services import create_operation
    from tests.support.operations import listening_worker

    planned = [create_operation("agent-drain", {"agent_ids": [a.agent_id]}, None) for a in _fleet(2)]
    page = browser_page(*PERMS, "operations.approve_operation", username="ops-approver")
    page.goto("/operations/")
    page.locator(f"#operation-{planned[-1].pk}").wait_for()
    review = page.get_by_role("button", name="Review approval of selected…")
    assert review.is_disabled()
    page.get_by_label("select every planned operation on this page").check()
    page.locator("[data-picked]").get_by_text("2 selected").wait_for()
    review.click()
    page.wait_for_url(re.compile(r"/operations/approve/\?op=\d+&op=\d+$"))
    for op in planned:
        page.locator(f"#bulk-operation-{op.pk} li").get_by_text(op.plan[0]["subject"]).wait_for()
    with listening_worker(settings.KICI_HOST_QUEUE):
        page.get_by_role("button", name="Approve 2 operations (2 targets)").click()
        page.wait_for_url(re.compile(r"/operations/$"))
    page.get_by_text("Approved 2 operations").wait_for()
    assert set(Operation.objects.values_list("status", flat=True)) == {"approved"}
