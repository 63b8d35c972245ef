"""Open pages follow the whole state of what they show, in Debian Chromium against a real daphne:
an agent page when its agent ends or its rules are rewritten, a console page when its agent is
released, a list when agents are admitted, and a page whose sockets were cut while it changed."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from agents.choices import AgentState, EventType
from agents.events import flush_events, record_event
from agents.models import Agent
from operations.kinds.host_access_apply import record_rules_rewrite
from scalers.admission.queue import shutdown_queue
from scalers.models import ConfigState, LabelSet, Scaler
from tests.support.admission import request_scale

pytestmark = pytest.mark.browser

OPERATOR = "operations.request_operation"


def _scaler(name: str = "ui-reconcile", type: str = "container") -> Scaler:
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    scaler = Scaler.objects.create(name=name, type=type, max_agents=10)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux", host_access=["172.30.0.1:53"])
    return scaler


def _running(scaler: Scaler, n: int = 1, **fields) -> Agent:
    return Agent.objects.create(
        agent_id=f"scaler-{scaler.type}-7ec0{n:04x}",
        scaler=scaler,
        label_set=scaler.label_sets.get(),
        state=AgentState.RUNNING,
        labels=["linux"],
        ip=f"172.30.0.{10 + n}",
        host_access=["172.30.0.1:53"],
        host_access_explicit=True,
        registered_at=timezone.now(),
        **fields,
    )


def _end(agent: Agent) -> None:
    """Destroy ``agent`` as its teardown would: state, end time, event, pushed."""
    Agent.objects.filter(pk=agent.pk).update(state=AgentState.DESTROYED, finished_at=timezone.now())
    record_event(agent, EventType.DESTROYED, "container removed")
    assert flush_events(5)


# Located as today's page and the page before it both have them, so a test fails on what a page
# shows, not on a missing id.
HEADER = ".page-head"
NETWORK = "section[aria-labelledby=h-net]"


def _assert_active_page(page) -> None:
    header = page.locator(HEADER)
    expect(header.get_by_role("button", name="Drain…")).to_be_visible()
    expect(header.get_by_role("button", name="Destroy…")).to_be_visible()
    expect(page.get_by_role("button", name="Run self-test")).to_be_enabled()
    expect(page.locator(NETWORK)).to_contain_text("Rules in force")


def _assert_ended_page(page) -> None:
    expect(page.locator("#agent-status")).to_contain_text("destroyed")
    expect(page.locator(HEADER).get_by_role("button")).to_have_count(0)  # no Drain, no Destroy
    expect(page.get_by_role("button", name="Run self-test")).to_be_disabled()
    network = page.locator(NETWORK)
    expect(network).not_to_contain_text("Rules in force")
    expect(network.locator("#rules-removed")).to_contain_text("removed with it when it was destroyed")
    expect(page.locator("#event-rows")).to_contain_text("container removed")


def test_an_open_agent_page_follows_its_agent_to_its_end(browser_page, wait_live, off_loop):
    agent = _running(_scaler())
    page = browser_page(OPERATOR)
    page.goto(f"/agents/{agent.agent_id}/")
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")
    _assert_active_page(page)

    off_loop(_end, agent)
    _assert_ended_page(page)
    expect(page.locator("#agent-details")).to_contain_text("destroyed")
    assert page.evaluate("window.__not_reloaded") is True
    assert not [e for e in page.js_errors if "page error" in e], page.js_errors


def test_a_host_access_change_shows_on_an_open_agent_page_and_in_its_timeline(browser_page, wait_live, off_loop):
    agent = _running(_scaler())
    page = browser_page(OPERATOR)
    page.goto(f"/agents/{agent.agent_id}/")
    wait_live(page)
    expect(page.locator("#host-access-entries")).to_have_text("172.30.0.1:53")

    def rewrite():
        record_rules_rewrite(agent, ["172.30.0.1:53", "*:9000"], True, 17, "1 rule(s) added, 0 removed")
        assert flush_events(5)

    off_loop(rewrite)
    expect(page.locator("#host-access-entries")).to_contain_text("*:9000")
    expect(page.locator("#event-rows")).to_contain_text("host access rewritten by operation #17")
    expect(page.locator(HEADER).get_by_role("button", name="Drain…")).to_be_visible()


def test_an_open_console_of_a_released_agent_says_it_finished(browser_page, wait_live, off_loop, tmp_path):
    vm = _scaler("ui-reconcile-fc", type="firecracker")
    serial = tmp_path / f"ui-{uuid.uuid4().hex[:8]}-serial-console.log"
    serial.write_text("boot: loading kernel\n")
    agent = _running(vm, backend_context={"console_logs": {"serial": str(serial), "vmm": str(tmp_path / "vmm.log")}})
    page = browser_page()
    page.goto(f"/agents/{agent.agent_id}/console/")
    status = page.locator("#console-root [data-live-status]")
    expect(status).to_have_text("live")
    page.locator("#console-lines").get_by_text("boot: loading kernel").wait_for()
    expect(page.locator("#console-follow")).to_have_text("Following")

    off_loop(_end, agent)
    expect(page.locator(".page-head .badge")).to_have_text("destroyed")
    expect(status).to_have_text("finished")
    expect(page.locator("#console-follow")).not_to_have_text("Following")


@pytest.fixture
def no_spawns(monkeypatch):
    monkeypatch.setattr("scalers.jobs.enqueue_spawn", lambda agent, host="": None)
    yield
    shutdown_queue()


def test_admitted_agents_appear_on_the_live_lists_at_admission(browser_page, wait_live, off_loop, no_spawns):
    Scaler.objects.filter(pk=_scaler().pk).update(max_concurrent_spawns=1)
    page = browser_page()
    page.goto("/agents/")
    wait_live(page)
    expect(page.locator("#list-count")).to_have_text("0 agents")

    admitted = [off_loop(request_scale, ["linux"], f"job-admitted-{n}").agent for n in range(3)]
    assert all(admitted)
    for agent_id in admitted:
        expect(page.locator(f"#agent-rows > #agent-{agent_id}")).to_contain_text("spawning")
    expect(page.locator("#list-count")).to_have_text("3 agents")
    expect(page.locator("#agent-rows > tr[id]")).to_have_count(3)


def test_a_page_whose_sockets_were_cut_says_so_and_catches_up(browser_page, wait_live, off_loop):
    agent = _running(_scaler())
    page = browser_page(OPERATOR)
    routes = []

    def through(ws):
        ws.connect_to_server()
        routes.append(ws)

    page.route_web_socket("**/ws/**", through)
    page.goto(f"/agents/{agent.agent_id}/")
    wait_live(page)
    _assert_active_page(page)
    # A fixed reconnect delay: the change below lands while every socket is away.
    page.evaluate("htmx.config.wsReconnectDelay = function () { return 3000; }")
    cut = list(routes)
    for ws in cut:
        ws.close(code=1012, reason="test: cut")
    status = page.locator("#agent-status")
    expect(status).to_have_text("disconnected")

    off_loop(_end, agent)
    expect(page.locator(HEADER).get_by_role("button", name="Drain…")).to_be_visible()  # missed, for now
    expect(status).to_have_text("disconnected")

    _assert_ended_page(page)  # the sockets came back: their first frames caught the page up
    assert len(routes) > len(cut)
