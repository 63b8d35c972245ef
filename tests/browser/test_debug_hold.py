"""A debug hold in Debian Chromium against a real daphne: the agent page's Hold… form plans an
agent-hold, approved it shows as armed with who and why; once the agent's job fails it shows as
held until its expiry on its page and on the agent list; Release hold… tears it down."""

from __future__ import annotations

import re
from unittest.mock import MagicMock, patch

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents.choices import AgentState
from agents.models import Agent
from operations.jobs import run_operation
from operations.models import Operation
from operations.services import approve_operation
from scalers.lifecycle import complete_job
from scalers.models import Reservation
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.browser

PERMS = ("operations.view_operation", "operations.request_operation", "operations.approve_operation")


def _approve_and_run_latest() -> Operation:
    op = Operation.objects.latest("pk")
    approve_operation(op, User.objects.get(username="hold-browser"), require_worker=False, enqueue=False)
    run_operation(op.pk)
    op.refresh_from_db()
    return op


def test_a_hold_is_asked_for_shown_and_released_from_the_agent_page(browser_page):
    agent = make_agent(make_scaler(), AgentState.RUNNING, managed_id="c" * 64, bound_job_id="job-1")
    page = browser_page(*PERMS, username="hold-browser")

    page.goto(f"/agents/{agent.agent_id}/")
    form = page.locator("#hold-form")
    form.get_by_label(f"why hold agent {agent.agent_id}").fill("the integration test fails only here")
    form.get_by_label("seconds to keep its sandbox once it ends").fill("1800")
    form.get_by_role("button", name="Hold…").click()
    page.get_by_role("button", name="Request approval").click()  # from the preview, which stores nothing
    page.wait_for_url(re.compile(r"/operations/\d+/$"))
    assert "hold its sandbox for 1800 s when it ends" in page.locator("#op-targets").inner_text()
    assert _approve_and_run_latest().status == "succeeded"

    page.goto(f"/agents/{agent.agent_id}/")
    expect(page.locator("#agent-hold")).to_contain_text("hold armed by hold-browser, approved by hold-browser")
    expect(page.locator("#agent-hold")).to_contain_text("the integration test fails only here")
    expect(page.locator("#hold-form")).to_have_count(0)

    complete_job(agent.agent_id, "job-1", failed=True)
    page.goto(f"/agents/{agent.agent_id}/")
    held = page.locator("#agent-hold")
    expect(held).to_contain_text("held by hold-browser, approved by hold-browser (operation #")
    expect(held).to_contain_text("kept from its teardown after job-complete (the job failed)")
    page.goto("/agents/?state=held")
    row = page.locator(f"#agent-{agent.agent_id}")
    expect(row.locator("[data-hold]")).to_contain_text("held until")

    page.goto(f"/agents/{agent.agent_id}/")
    page.get_by_role("button", name="Release hold…").click()
    page.get_by_role("button", name="Request approval").click()
    page.wait_for_url(re.compile(r"/operations/\d+/$"))
    backend = MagicMock()
    with patch("scalers.lifecycle.get_backend", return_value=backend):
        assert _approve_and_run_latest().status == "succeeded"
    backend.destroy.assert_called_once()
    assert Agent.objects.get(pk=agent.pk).state == AgentState.DESTROYED
    assert not Reservation.objects.filter(agent=agent).exists()
