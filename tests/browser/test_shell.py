"""An approver's shell into a running container agent, in Debian Chromium with the console's
Content-Security-Policy enforced: opened from the agent's page, a command typed and its output
seen in the terminal, then the transcript in the agent's archive and the audit records."""

from __future__ import annotations

import contextlib
import random
import re
import time
import uuid

import docker.errors
import pytest
from playwright.sync_api import expect

from agents.archive import shell_transcript_path
from agents.choices import AgentState
from agents.models import Agent
from audit.models import AuditRecord
from scalers.models import Scaler
from tests.browser.test_browser_security import COLLECT_VIOLATIONS
from tests.support.docker import run_script

pytestmark = [pytest.mark.browser, pytest.mark.docker]


@pytest.fixture
def container_agent(dockerd, docker_client, agent_image):
    container = run_script(docker_client, agent_image, "sleep 300", "ui-shell")
    try:
        scaler = Scaler.objects.create(name="ui-shell", type="container", max_agents=2, config={"host": dockerd})
        yield Agent.objects.create(
            agent_id=f"scaler-container-5e11{uuid.uuid4().hex[:4]}",
            scaler=scaler,
            managed_id=container.id,
            state=AgentState.RUNNING,
        )
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def _policy(response) -> dict[str, str]:
    policy = response.headers.get("content-security-policy", "")
    return dict((part.strip().split(" ", 1) + [""])[:2] for part in policy.split(";") if part.strip())


def _shell_records(agent_id: str, within: float = 10) -> list[AuditRecord]:
    deadline = time.monotonic() + within
    while True:
        records = list(AuditRecord.objects.filter(agent_ref=agent_id, action__startswith="shell.").order_by("at", "id"))
        if any(r.action == "shell.closed" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def test_an_approver_opens_a_shell_types_a_command_and_finds_it_in_the_archive_and_the_audit(
    browser_page, container_agent
):
    agent = container_agent
    page = browser_page("operations.approve_operation", username="ui-shell-approver", csp=True)
    page.context.add_init_script(COLLECT_VIOLATIONS)
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)

    agent_policy = _policy(page.goto(f"/agents/{agent.agent_id}/"))
    with page.expect_navigation() as navigation:
        page.locator("#shell-link").click()
    assert page.url.endswith(f"/agents/{agent.agent_id}/shell/")
    shell_policy = _policy(navigation.value)
    # The shell page keeps the site's strict policy (no per-view exception, no 'unsafe-inline'); its
    # style-src names the request's nonce, which Django adds to a page that uses it.
    assert re.fullmatch(r"'self' 'nonce-[\w+/=-]+'", shell_policy["style-src"]), shell_policy
    assert {**shell_policy, "style-src": "'self'"} == agent_policy, (shell_policy, agent_policy)
    assert agent_policy["script-src"] == "'self'" and "unsafe" not in " ".join(agent_policy.values()), agent_policy

    expect(page.locator("#shell-root")).to_have_attribute("data-state", "open")
    number = random.randint(1000, 9999)
    typed, shown = f"echo shell-$(({number}*2))-marker", f"shell-{number * 2}-marker"
    page.locator("#shell-root").click()
    page.keyboard.type(typed)
    page.keyboard.press("Enter")
    expect(page.locator("#shell-root .xterm-rows")).to_contain_text(shown)
    # xterm.js drew with its own <style> elements, which the policy allowed through the nonce.
    assert page.evaluate("document.querySelectorAll('#shell-root style').length") >= 1
    assert page.evaluate("window.__cspViolations") + violations == []
    assert not page.js_errors, page.js_errors

    page.close()  # the browser just goes away
    records = _shell_records(agent.agent_id)
    assert [r.action for r in records] == ["shell.opened", "shell.closed"], records
    assert all(r.actor == "ui-shell-approver" for r in records)
    assert "the browser closed the shell" in records[1].detail
    transcript = shell_transcript_path(agent.agent_id).read_text(errors="replace")
    assert "[kici-shell input by ui-shell-approver at " in transcript
    assert f"] {typed}\n" in transcript and shown in transcript, transcript
