"""A container's console in Debian Chromium: its lines keep their numbers in the container's output
across a reload, and earlier lines load from its docker logs when scrolled to."""

from __future__ import annotations

import re
import time
import uuid

import pytest
import redis
from django.conf import settings

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import Scaler
from tests.support.docker import run_script

pytestmark = [pytest.mark.browser, pytest.mark.docker]

LINES = 1500


@pytest.fixture
def container_agent(dockerd, docker_client, agent_image):
    script = f"i=1; while [ $i -le {LINES} ]; do echo line $i; i=$((i+1)); done; sleep 0.2; echo done >&2; sleep 120"
    container = run_script(docker_client, agent_image, script, "ui-ctr-console")
    try:
        for _ in range(100):
            if b"done" in container.logs(tail=1):
                break
            time.sleep(0.1)
        scaler = Scaler.objects.create(name="ui-ctr-console", type="container", max_agents=2, config={"host": dockerd})
        agent = Agent.objects.create(
            agent_id=f"scaler-container-c0a5{uuid.uuid4().hex[:4]}",
            scaler=scaler,
            managed_id=container.id,
            state=AgentState.RUNNING,
        )
        yield agent
    finally:
        container.remove(force=True)
        client = redis.Redis.from_url(settings.REDIS_URL)
        for name in client.scan_iter(f"kici:console:{agent.agent_id}:*"):
            client.delete(name)
        client.close()


def first_line(page) -> int:
    return int(page.locator("#console-root").get_attribute("data-first-line"))


def test_a_container_consoles_numbers_survive_a_reload_and_earlier_lines_load(browser_page, wait_live, container_agent):
    page = browser_page()
    page.goto(f"/agents/{container_agent.agent_id}/console/")
    wait_live(page)
    last = page.locator(f"#L{LINES + 1}")
    last.wait_for()
    assert last.locator(".tx").inner_text() == "done"  # stderr, 0.2 s after stdout's lines
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", last.locator(".ts").inner_text())  # docker's time
    assert first_line(page) == LINES + 1 - 499  # the last 500 lines, numbered in the output

    page.reload()
    wait_live(page)
    page.locator(f"#L{LINES + 1}").wait_for()
    assert first_line(page) == LINES + 1 - 499
    assert page.locator(f"#L{LINES} .tx").inner_text() == f"line {LINES}"

    # Load earlier: the gap above the loaded lines reads them from the container's docker logs.
    page.keyboard.press("g")
    page.wait_for_function(f"+document.getElementById('console-root').dataset.firstLine === {LINES + 1 - 999}")
    assert page.locator(f"#L{LINES - 500} .tx").inner_text() == f"line {LINES - 500}"
    page.keyboard.press("g")
    page.wait_for_function(f"+document.getElementById('console-root').dataset.firstLine === {LINES + 1 - 1499}")
    # A link to an early line leads to it after a reload (it is loaded from docker's logs).
    page.evaluate("location.hash = '#L7'")
    page.reload()
    wait_live(page)
    target = page.locator("#L7.is-target")
    target.wait_for()
    assert target.locator(".tx").inner_text() == "line 7"
    assert not page.js_errors, page.js_errors
