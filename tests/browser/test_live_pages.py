"""The console pages in Debian Chromium against a real daphne: live updates without reload."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

from agents.choices import AgentState, EventType
from agents.events import record_event
from agents.models import Agent
from scalers.models import ConfigState, LabelSet, Reservation, Scaler

pytestmark = pytest.mark.browser


def _container_scaler() -> Scaler:
    ConfigState.objects.update_or_create(pk=1, defaults={"global_max_agents": 10})
    scaler = Scaler.objects.create(name="ui-browser-ci", type="container", max_agents=4)
    LabelSet.objects.create(scaler=scaler, index=0, labels=["linux"], normalized="linux", host_access=["172.30.0.1:53"])
    return scaler


def test_the_dashboard_shows_a_new_agent_and_its_state_changes_without_reload(browser_page, wait_live, off_loop):
    scaler = _container_scaler()
    page = browser_page()
    page.goto("/")
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")
    card = page.locator(f"#cap-scaler-{scaler.pk}")
    assert "0 / 4" in card.inner_text().replace("\n", " ")

    agent = Agent.objects.create(
        agent_id="scaler-container-0b0e5e01",
        scaler=scaler,
        label_set=scaler.label_sets.get(),
        state=AgentState.SPAWNING,
        labels=["linux"],
    )
    Reservation.objects.create(scaler=scaler, agent=agent, cpus=1, memory_bytes=2**30, owner_instance="ui")
    off_loop(record_event, agent, EventType.PROVISIONING, "creating container")

    row = page.locator(f"#agent-rows > #agent-{agent.agent_id}")
    row.wait_for()
    assert "spawning" in row.inner_text()
    page.locator("#event-rows").get_by_text("creating container").wait_for()
    page.wait_for_function(
        f"document.querySelector('#cap-scaler-{scaler.pk}').innerText.replace(/\\s+/g, ' ').includes('1 / 4')"
    )

    Agent.objects.filter(pk=agent.pk).update(state=AgentState.RUNNING, ip="172.30.0.9")
    off_loop(record_event, agent, EventType.READY, "container started")
    page.wait_for_function(f"document.querySelector('#agent-{agent.agent_id} .badge').textContent.trim() === 'running'")
    assert page.locator(f"#agent-{agent.agent_id}").count() == 1  # updated in place, not duplicated

    def burst():  # several events of one agent, most likely pushed in one frame
        record_event(agent, EventType.CONNECTING, "waiting for agent WS registration")
        Agent.objects.filter(pk=agent.pk).update(active_jobs=1, bound_job_id="job-77")
        record_event(agent, EventType.REGISTERED, "registered")

    off_loop(burst)
    page.locator("#event-rows").get_by_text("waiting for agent WS registration").wait_for()
    page.locator("#event-rows").get_by_text("registered", exact=True).wait_for()
    page.wait_for_function(f"document.querySelector('#agent-{agent.agent_id}').innerText.includes('job-77')")
    assert page.locator(f"#agent-{agent.agent_id}").count() == 1
    assert page.locator("#event-rows > tr").count() == 4
    assert page.evaluate("window.__not_reloaded") is True
    assert not [e for e in page.js_errors if "htmx" in e or "page error" in e], page.js_errors


def test_the_host_access_editor_flags_a_hostname_as_it_is_typed(browser_page):
    scaler = _container_scaler()
    page = browser_page("operations.request_operation")
    page.goto(f"/scalers/{scaler.name}/label-sets/0/host-access/")
    textarea = page.locator("#entries")
    textarea.fill("")
    textarea.type("172.30.0.1:53\nci.example.com:443", delay=5)
    bad = page.locator("#entry-checks tr.entry-bad")
    # A pause while typing (a loaded host) may first show the check of a prefix such as "ci": wait
    # for the check of the whole line, which replaces it.
    expect(bad).to_contain_text("ci.example.com:443", timeout=15_000)
    assert "Hostnames are not accepted" in bad.inner_text()
    assert page.locator("#preview button[type=submit]").is_disabled()
    assert page.locator("#preview-errors").is_visible()

    textarea.fill("172.30.0.1:53\n10.0.0.5:443")
    page.locator("#entry-checks tr.entry-bad").wait_for(state="detached")
    assert "TCP and UDP port 443 on 10.0.0.5" in page.locator("#entry-checks").inner_text()
    assert "10.0.0.5:443" in page.locator("#effective").inner_text()
    assert page.locator("#preview #apply").is_enabled()


def test_the_console_page_shows_lines_appended_to_the_serial_log_live(browser_page, wait_live, tmp_path):
    vm = Scaler.objects.create(name="ui-browser-fc", type="firecracker", max_agents=2)
    LabelSet.objects.create(scaler=vm, index=0, labels=["kvm"], normalized="kvm")
    serial: Path = tmp_path / f"ui-{uuid.uuid4().hex[:8]}-serial-console.log"
    serial.write_text("boot: loading kernel\n")
    agent = Agent.objects.create(
        agent_id="scaler-firecracker-0c0501e0",
        scaler=vm,
        state=AgentState.RUNNING,
        backend_context={"console_logs": {"serial": str(serial), "vmm": str(tmp_path / "vmm.log")}},
    )
    page = browser_page()
    page.goto(f"/agents/{agent.agent_id}/console/")
    wait_live(page)
    lines = page.locator("#console-lines")
    lines.get_by_text("boot: loading kernel").wait_for()

    with serial.open("a") as f:
        f.write("init: mounting overlay\nKernel panic - not syncing: VFS: Unable to mount root fs\n")
    lines.get_by_text("init: mounting overlay").wait_for()
    panic = lines.locator(".cl.is-error")
    panic.wait_for()
    assert "Kernel panic" in panic.inner_text()
    assert "3 lines loaded" in page.locator("#console-count").inner_text()

    # search within the loaded lines, from the keyboard
    page.locator("body").press("/")
    page.keyboard.type("overlay")
    page.wait_for_function("document.getElementById('console-matches').textContent.startsWith('1 match')")
    assert page.locator("#console-lines mark").inner_text() == "overlay"

    # f pauses following; appended lines still arrive and are counted as new
    page.locator("#console-search").press("Escape")
    page.keyboard.press("f")
    expect(page.locator("#console-root")).to_have_attribute("data-follow", "off")
    with serial.open("a") as f:
        f.write("agent: <b>registered</b>\n")
    lines.get_by_text("agent: <b>registered</b>").wait_for()  # what the guest writes is text
    assert lines.locator("b").count() == 0
    assert "1 new below" in page.locator("#console-new").inner_text()
    page.keyboard.press("Shift+G")
    expect(page.locator("#console-root")).to_have_attribute("data-follow", "on")

    # a line number is a link to that line
    page.locator("#L2 a.ln").click()
    assert page.evaluate("location.hash") == "#L2"
    # The page marks the target on its hashchange handler, after the click returns: wait for it.
    expect(page.locator("#L2")).to_have_class(re.compile(r"\bis-target\b"))
    expect(page.locator("#console-root")).to_have_attribute("data-follow", "off")


def test_the_agents_list_filters_as_you_type_from_the_keyboard(browser_page):
    scaler = _container_scaler()
    for n, job in ((1, "job-alpha"), (2, "job-beta")):
        Agent.objects.create(
            agent_id=f"scaler-container-0f11e00{n}",
            scaler=scaler,
            state=AgentState.RUNNING,
            labels=["linux"],
            bound_job_id=job,
        )
    page = browser_page()
    page.goto("/agents/")
    page.evaluate("window.__not_reloaded = true")
    assert page.locator("#agent-rows > tr").count() == 2
    page.locator("body").press("/")
    page.keyboard.type("beta")
    page.wait_for_function("document.querySelectorAll('#agent-rows > tr').length === 1")
    assert page.locator("#agent-rows > tr").first.get_attribute("id") == "agent-scaler-container-0f11e002"
    assert "q=beta" in page.url and page.evaluate("window.__not_reloaded") is True
